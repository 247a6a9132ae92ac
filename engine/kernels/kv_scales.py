"""Argument checks for the int8 KV cache's scale tensors, shared by the Triton wrappers.

Layout (see engine/kernels/torch_ref.py): beside an int8 cache [num_blocks, block_size,
num_kv_heads, head_dim], fp16 scales [num_blocks, block_size, num_kv_heads], one per token and
KV head, for K and for V; views of one all-layer tensor, so K and V scales share strides."""

from __future__ import annotations

import torch

from engine.kernels.torch_ref import KV_SCALE_DTYPE


def check_kv_scales(
    name: str,
    k_cache: torch.Tensor,
    k_scales: torch.Tensor | None,
    v_scales: torch.Tensor | None,
) -> None:
    """Raise ValueError unless an int8 cache comes with matching scales and a float cache with
    none."""
    if k_cache.dtype != torch.int8:
        if k_scales is not None or v_scales is not None:
            raise ValueError(f"{name}: k_scales/v_scales are only for an int8 cache")
        return
    if k_scales is None or v_scales is None:
        raise ValueError(f"{name}: an int8 cache needs k_scales and v_scales")
    expected = tuple(k_cache.shape[:3])
    for label, s in (("k_scales", k_scales), ("v_scales", v_scales)):
        if tuple(s.shape) != expected or s.dtype != KV_SCALE_DTYPE:
            raise ValueError(
                f"{name}: {label} must be {KV_SCALE_DTYPE} {list(expected)} (num_blocks, "
                f"block_size, num_kv_heads), got {s.dtype} {list(s.shape)}"
            )
        if s.device != k_cache.device:
            raise ValueError(f"{name}: {label} is on {s.device}, the cache on {k_cache.device}")
    if k_scales.stride(-1) != 1 or k_scales.stride() != v_scales.stride():
        raise ValueError(
            f"{name}: k_scales/v_scales must share strides with a unit-stride last dim, got "
            f"{k_scales.stride()} and {v_scales.stride()}"
        )
