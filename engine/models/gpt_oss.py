"""Our gpt-oss model: Llama's decoder with q/k/v/o biases, per-head attention sinks,
sliding-window layers alternating with full ones (cfg.layer_attention), YaRN RoPE, and in
every layer a mixture of experts (router with bias, top-k then softmax routing, experts with
biases and gpt-oss's clamped SwiGLU).

Checkpoints hold each layer's experts in one of two layouts (our MoE layout is in
engine/kernels/moe_ref.py: w_gate_up [E, 2I, H] with the gate's rows first, w_down [E, H, I]):
- 16-bit, as transformers' save_pretrained writes GptOssForCausalLM: `mlp.experts.gate_up_proj`
  [E, H, 2I] with gate and up interleaved by column, `down_proj` [E, I, H];
- MXFP4, as gpt-oss-20b ships: `mlp.experts.gate_up_proj_blocks/_scales` (rows interleaved)
  and `down_proj_blocks/_scales`, dequantized at load (engine/quant/mxfp4.py).
Both hold `gate_up_proj_bias` [E, 2I] (interleaved) and `down_proj_bias` [E, H]. The router
is `mlp.router.{weight,bias}`, the sinks `self_attn.sinks` [num_heads].
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from engine.kernels.moe_ref import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from engine.models.llama import LlamaForCausalLM
from engine.models.model_config import ModelConfig
from engine.models.moe_block import MoEBlock, topk_softmax
from engine.models.weights import missing_error
from engine.quant.mxfp4 import dequantize_mxfp4, gate_up_rows_first

_EXPERTS = re.compile(
    r"layers\.(\d+)\.mlp\.experts\."
    r"(gate_up_proj|down_proj)(|_bias|_blocks|_scales)"
)
"""An expert tensor's name (without "model."): layer, projection, and what it holds."""
_RENAMED = (
    (re.compile(r"(layers\.\d+\.self_attn)\.sinks"), r"\1.attn.sinks"),
    (re.compile(r"(layers\.\d+\.mlp)\.router\."), r"\1.gate."),
)
"""Checkpoint names -> ours, for the weights Llama's loader fills."""


class GptOssForCausalLM(LlamaForCausalLM):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        alpha, limit = cfg.swiglu
        if alpha not in (None, SWIGLU_OAI_ALPHA) or limit not in (None, SWIGLU_OAI_LIMIT):
            raise ValueError(
                f"config.json has swiglu_alpha={alpha}, swiglu_limit={limit}; the engine's "
                f"experts compute gpt-oss's {SWIGLU_OAI_ALPHA} and {SWIGLU_OAI_LIMIT} only "
                "(engine/kernels/moe_ref.py): remove them or set those values"
            )
        super().__init__(cfg, max_positions)  # Attention gives each layer its window and sinks

    def make_mlp(self, layer: int) -> nn.Module:
        cfg = self.config
        return MoEBlock(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            topk_softmax,
            activation="swiglu_oai",
            router_bias=True,
            expert_bias=True,
        )

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    ) -> None:
        """The experts load here, in either layout; every other weight through Llama's loader
        (router and sinks renamed). A missing expert tensor, an unknown one, or one for a layer
        past num_hidden_layers is an error that names it."""
        cfg = self.config
        loaded: set[tuple[int, str]] = set()  # (layer, our parameter)
        pending: dict[tuple[int, str], dict[str, torch.Tensor]] = {}  # MXFP4 halves waiting

        def others() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                short = name.removeprefix("model.")
                match = _EXPERTS.fullmatch(short)
                if match is None:
                    for pattern, ours in _RENAMED:
                        short = pattern.sub(ours, short)
                    yield short, tensor
                    continue
                layer, proj, kind = int(match[1]), match[2], match[3]
                if layer >= cfg.num_layers:
                    raise ValueError(
                        f"unexpected weight {name!r} in checkpoint: the config has "
                        f"num_hidden_layers={cfg.num_layers}"
                    )
                block: MoEBlock = self.layers[layer].mlp
                if kind in ("_blocks", "_scales"):
                    halves = pending.setdefault((layer, proj), {})
                    halves[kind] = tensor
                    if len(halves) < 2:
                        continue
                    del pending[(layer, proj)]
                    param = block.w_gate_up if proj == "gate_up_proj" else block.w_down
                    tensor, kind = _dequantize(proj, halves, param), "dequantized"
                target = _load_expert(block, name, proj, kind, tensor, copy)
                loaded.add((layer, target))

        stacked = {
            f"layers.{i}.mlp.{p}"
            for i in range(cfg.num_layers)
            for p in ("w_gate_up", "w_down", "b_gate_up", "b_down")
        }
        super().load_weights(others(), copy, loaded_elsewhere=stacked)
        unpaired = [
            f"model.layers.{i}.mlp.experts.{p}{next(iter(h))}" for (i, p), h in pending.items()
        ]
        if unpaired:
            raise ValueError(
                f"checkpoint has MXFP4 blocks without scales or scales without blocks: {unpaired}"
            )
        missing = [
            f"model.layers.{i}.mlp.experts.{name}"
            for i in range(cfg.num_layers)
            for ours, name in _CHECKPOINT_NAME.items()
            if (i, ours) not in loaded
        ]
        if missing:
            raise missing_error("checkpoint", missing, "expert weights")


_CHECKPOINT_NAME = {
    "w_gate_up": "gate_up_proj (or gate_up_proj_blocks and _scales)",
    "w_down": "down_proj (or down_proj_blocks and _scales)",
    "b_gate_up": "gate_up_proj_bias",
    "b_down": "down_proj_bias",
}
"""Our stacked expert parameter -> the checkpoint tensors that fill it (for errors)."""


def _dequantize(proj: str, halves: dict[str, torch.Tensor], param: torch.Tensor) -> torch.Tensor:
    """MXFP4 blocks and scales -> the weight in our layout ([E, 2I, H] gate rows first, or
    [E, H, I]) in param's dtype on its device (exact for bf16 and fp32: the values have at
    most 3 significant bits)."""
    blocks, scales = halves["_blocks"], halves["_scales"]
    if proj == "gate_up_proj":  # reorder the bytes: a quarter of the weight's
        blocks, scales = gate_up_rows_first(blocks), gate_up_rows_first(scales)
    return dequantize_mxfp4(blocks.to(param.device), scales.to(param.device), param.dtype)


def _load_expert(
    block: MoEBlock,
    name: str,
    proj: str,
    kind: str,
    tensor: torch.Tensor,
    copy: Callable[[torch.Tensor, torch.Tensor], object],
) -> str:
    """Copy one layer's expert tensor into our parameter; returns the parameter's name.
    kind "_bias": a bias (gate and up interleaved for gate_up_proj); "": transformers' weight
    layout [E, in, out] (transposed here; for gpt-oss-20b down_proj is square, so the shape
    cannot tell the layouts apart); "dequantized": an MXFP4 weight already in ours."""
    target = ("b_" if kind == "_bias" else "w_") + proj.removesuffix("_proj")
    param = getattr(block, target)
    expected = param.transpose(1, 2).shape if kind == "" else param.shape
    if tensor.shape != expected:
        raise ValueError(
            f"weight {name!r}: shape {tuple(tensor.shape)}, expected {tuple(expected)}"
        )
    if kind == "dequantized":  # made on param's device: copied now, one at a time
        param.copy_(tensor)
        return target
    if kind == "":
        tensor = tensor.transpose(1, 2)  # [E, in, out] -> [E, out, in]
    if proj == "gate_up_proj":
        tensor = gate_up_rows_first(tensor)
    copy(param, tensor)
    return target
