"""Gemma 4 checkpoint loading: Hugging Face names into our fused parameters (q/k/v into
qkv_proj with each layer's own parts, gate/up into gate_up_proj with each layer's width), the
MoE block's weights through its own loader, the vision and audio towers skipped. Gemma 4's
norm weights are used as stored (x * w)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable

import torch
from torch import nn

from engine.models.gemma3 import TEXT_PREFIXES
from engine.models.gemma4_moe import CHECKPOINT_NAMES as MOE_NAMES

logger = logging.getLogger(__name__)

SKIPPED_PREFIXES = tuple(
    f"{root}{tower}"
    for root in ("model.", "")
    for tower in ("vision_tower.", "audio_tower.", "embed_vision.", "embed_audio.")
)
"""A multimodal checkpoint's image and audio encoders and their projections into the text
model: skipped (text generation only)."""

_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
_GATE_UP = {"gate_proj": 0, "up_proj": 1}
_LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)")
_SHARED_LAYER_KV = ("self_attn.k_proj.", "self_attn.v_proj.", "self_attn.k_norm.")
"""What a K/V-sharing layer's checkpoint may still hold but does not use (transformers ignores
them as well)."""


def _fused_target(model: nn.Module, name: str) -> tuple[str, int | None, list[int] | None]:
    """Our parameter for a checkpoint name: (name, shard, the fused parameter's row sizes);
    shard None for an unfused one."""
    for parts, fused in ((_QKV, "qkv_proj"), (_GATE_UP, "gate_up_proj")):
        for part, index in parts.items():
            if f".{part}." in name:
                target = name.replace(part, fused)
                try:
                    module = model.get_submodule(target.rsplit(".", 2)[0])
                except AttributeError:
                    raise ValueError(
                        f"unexpected weight {name!r} in a Gemma 4 checkpoint"
                    ) from None
                if fused == "qkv_proj":
                    return target, index, module.shard_sizes
                return target, index, [module.gate_up_proj.out_features // 2] * 2
    return name, None, None


@torch.no_grad()
def load_gemma4_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
) -> None:
    """Copy each tensor into `model` (a Gemma4ForCausalLM); raise on an unexpected name, a
    wrong shape, or a parameter left unfilled. `copy(dst, src)` as in llama.py."""
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.config.tie_word_embeddings
    loaded: set[str] = set()
    expected: set[str] = set()
    num_skipped = num_unused = 0
    for name, tensor in weights:
        if name.startswith(SKIPPED_PREFIXES):
            num_skipped += 1
            continue
        name = next((name[len(p) :] for p in TEXT_PREFIXES if name.startswith(p)), name)
        if "rotary_emb" in name or (name == "lm_head.weight" and tied):
            continue
        match = _LAYER_NAME.fullmatch(name)
        layer = model.layers[int(match[1])] if match and int(match[1]) < len(model.layers) else None
        if (
            layer is not None
            and layer.self_attn.kv_shared
            and match[2].startswith(_SHARED_LAYER_KV)
        ):
            num_unused += 1
            continue
        if layer is not None and layer.moe is not None and match[2] in MOE_NAMES:
            ours = layer.moe.load_checkpoint_weight(match[2], tensor, copy)
            loaded.add(f"layers.{match[1]}.moe.{ours}#None")
            continue
        target, shard, sizes = (
            _fused_target(model, name) if layer is not None else (name, None, None)
        )
        if target not in params or (shard is not None and shard >= len(sizes)):
            raise ValueError(f"unexpected weight {name!r} in a Gemma 4 checkpoint")
        dst = params[target]
        if shard is not None:
            dst = dst.narrow(0, sum(sizes[:shard]), sizes[shard])
        if dst.shape != tensor.shape:
            raise ValueError(
                f"weight {name!r}: shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
            )
        copy(dst, tensor)
        loaded.add(f"{target}#{shard}")
    if num_skipped:
        logger.info("skipped %d vision and audio tower weights (text generation only)", num_skipped)
    if num_unused:
        logger.info("skipped %d k/v weights of the layers that share K/V", num_unused)
    for pname in params:
        if pname == "lm_head.weight" and tied:
            continue
        if pname.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            parts = len(model.get_submodule(pname.rsplit(".", 2)[0]).shard_sizes)
            expected.update(f"{pname}#{i}" for i in range(parts))
        elif pname.endswith("gate_up_proj.weight") and ".moe." not in pname:
            expected.update(f"{pname}#{i}" for i in range(2))
        else:
            expected.add(f"{pname}#None")
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(
            f"Gemma 4 checkpoint is missing weights: {missing[:5]}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
