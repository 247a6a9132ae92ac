"""Our Qwen3-MoE model: Qwen3's decoder (q/k RMSNorm attention) with a mixture-of-experts
block in place of the MLP where cfg.is_moe_layer(i), a dense MLP elsewhere.

Checkpoints name each expert (`layers.L.mlp.experts.N.{gate,up,down}_proj.weight`, as hub
checkpoints and transformers' save_pretrained write them) or hold them fused per layer
(`layers.L.mlp.experts.gate_up_proj` [E, 2I, H] and `.down_proj` [E, H, I], transformers' own
parameters); both load into MoEBlock's stacked `w_gate_up` and `w_down`. The router is
`layers.L.mlp.gate.weight`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from engine.models.llama import MLP, LlamaForCausalLM
from engine.models.moe import MoEBlock, softmax_topk, softmax_topk_renormalized

_EXPERT = re.compile(
    r"layers\.(\d+)\.mlp\.experts\.(?:(\d+)\.(gate_proj|up_proj|down_proj)\.weight"
    r"|(gate_up_proj|down_proj))"
)
"""An expert weight's name (without "model."): per expert, or one layer's experts fused."""
_SHARDS = {"gate_proj": ("w_gate_up", 0), "up_proj": ("w_gate_up", 1), "down_proj": ("w_down", 0)}
"""Per-expert checkpoint name -> (our stacked parameter, which half of its rows)."""


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    def make_mlp(self, layer: int) -> nn.Module:
        cfg = self.config
        if not cfg.is_moe_layer(layer):
            return MLP(cfg)
        rule = softmax_topk_renormalized if cfg.norm_topk_prob else softmax_topk
        return MoEBlock(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            rule,
        )

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    ) -> None:
        """The experts load here, in either naming; every other weight as in Llama's loader.
        A missing expert, or an expert weight for a dense layer or past num_experts, is an
        error that names it."""
        cfg = self.config
        loaded: set[tuple[int, int, str]] = set()  # (layer, expert, checkpoint projection)

        def others() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                match = _EXPERT.fullmatch(name.removeprefix("model."))
                if match is None:
                    yield name, tensor
                    continue
                layer, expert, proj, fused = match.groups()
                block = self._moe_block(int(layer), name)
                if fused is None:
                    self._load_expert(block, name, int(expert), proj, tensor, copy)
                    loaded.add((int(layer), int(expert), proj))
                else:
                    param = getattr(block, "w_gate_up" if fused == "gate_up_proj" else "w_down")
                    _check_shape(name, tensor, param)
                    copy(param, tensor)
                    projs = ("gate_proj", "up_proj") if fused == "gate_up_proj" else ("down_proj",)
                    loaded.update((int(layer), e, p) for e in range(cfg.num_experts) for p in projs)

        stacked = {
            f"layers.{i}.mlp.{p}"
            for i in range(cfg.num_layers)
            if cfg.is_moe_layer(i)
            for p in ("w_gate_up", "w_down")
        }
        super().load_weights(others(), copy, loaded_elsewhere=stacked)
        missing = [
            f"model.layers.{i}.mlp.experts.{e}.{p}.weight"
            for i in range(cfg.num_layers)
            if cfg.is_moe_layer(i)
            for e in range(cfg.num_experts)
            for p in _SHARDS
            if (i, e, p) not in loaded
        ]
        if missing:
            raise ValueError(
                f"checkpoint is missing expert weights: {missing[:5]}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            )

    def _moe_block(self, layer: int, name: str) -> MoEBlock:
        if layer >= self.config.num_layers or not self.config.is_moe_layer(layer):
            raise ValueError(
                f"unexpected weight {name!r} in checkpoint: layer {layer} has no experts "
                f"(dense layers: {list(self.config.dense_layers)}, "
                f"num_hidden_layers={self.config.num_layers})"
            )
        return self.layers[layer].mlp

    def _load_expert(
        self,
        block: MoEBlock,
        name: str,
        expert: int,
        proj: str,
        tensor: torch.Tensor,
        copy: Callable[[torch.Tensor, torch.Tensor], object],
    ) -> None:
        if expert >= block.num_experts:
            raise ValueError(
                f"unexpected weight {name!r} in checkpoint: the config has "
                f"num_experts={block.num_experts}"
            )
        stacked, half = _SHARDS[proj]
        dst = getattr(block, stacked)[expert]  # [2 * inter, hidden] or [hidden, inter]
        if stacked == "w_gate_up":
            inter = block.intermediate_size
            dst = dst.narrow(0, half * inter, inter)  # [inter, hidden]
        _check_shape(name, tensor, dst)
        copy(dst, tensor)


def _check_shape(name: str, tensor: torch.Tensor, dst: torch.Tensor) -> None:
    if dst.shape != tensor.shape:
        raise ValueError(
            f"weight {name!r}: shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
        )
