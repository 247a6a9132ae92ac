"""Gemma 4 checkpoint loading: Hugging Face names into our fused parameters (q/k/v into
qkv_proj with each layer's own parts, gate/up into gate_up_proj with each layer's width), the
MoE block's weights through its own loader, the vision and audio towers skipped. Gemma 4's
norm weights are used as stored (x * w)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable

import torch
from torch import nn

from engine.models.gemma3 import TEXT_PREFIXES
from engine.models.gemma4_moe import CHECKPOINT_NAMES as MOE_NAMES
from engine.models.weights import QKV_GATE_UP, WeightLoader, fused_name

logger = logging.getLogger(__name__)

SKIPPED_PREFIXES = tuple(
    f"{root}{tower}"
    for root in ("model.", "")
    for tower in ("vision_tower.", "audio_tower.", "embed_vision.", "embed_audio.")
)
"""A multimodal checkpoint's audio encoder, and its image encoder where the config has none,
with their projections into the text model: skipped."""

_LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)")
_SHARED_LAYER_KV = ("self_attn.k_proj.", "self_attn.v_proj.", "self_attn.k_norm.")
"""What a K/V-sharing layer's checkpoint may still hold but does not use (transformers ignores
them as well)."""


def _fused_target(model: nn.Module, name: str) -> tuple[str, int | None, list[int] | None]:
    """Our parameter for a checkpoint name: (name, shard, the fused parameter's row sizes);
    shard None for an unfused one."""
    target, shard = fused_name(name, QKV_GATE_UP)
    if shard is None:
        return name, None, None
    try:
        module = model.get_submodule(target.rsplit(".", 2)[0])
    except AttributeError:
        raise ValueError(f"unexpected weight {name!r} in a Gemma 4 checkpoint") from None
    if "qkv_proj" in target:
        return target, shard, module.shard_sizes
    return target, shard, [module.gate_up_proj.out_features // 2] * 2


@torch.no_grad()
def load_gemma4_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    loaded_elsewhere: Collection[str] = (),
) -> None:
    """Copy each tensor into `model` (a Gemma4ForCausalLM); raise on an unexpected name, a
    wrong shape, or a parameter left unfilled. `copy(dst, src)` as in llama.py.
    `loaded_elsewhere`: our parameter names the caller fills (the vision encoder's)."""
    loader = WeightLoader(model, copy, "Gemma 4", TEXT_PREFIXES, SKIPPED_PREFIXES, loaded_elsewhere)
    num_unused = 0
    for name, tensor in weights:
        name = loader.text_name(name)
        if name is None:
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
            loader.mark(f"layers.{match[1]}.moe.{ours}")
            continue
        target, shard, sizes = (
            _fused_target(model, name) if layer is not None else (name, None, None)
        )
        loader.load(name, target, shard, sizes, tensor)
    loader.log_skipped(logger, "vision and audio tower weights")
    if num_unused:
        logger.info("skipped %d k/v weights of the layers that share K/V", num_unused)

    def num_shards(pname: str) -> int | None:
        if pname.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            return len(model.get_submodule(pname.rsplit(".", 2)[0]).shard_sizes)
        if pname.endswith("gate_up_proj.weight") and ".moe." not in pname:
            return 2
        return None

    loader.check_complete(num_shards)
