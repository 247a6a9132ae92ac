"""Triton kernel that writes this step's new K/V rows into the paged KV cache (store_kv)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kc_block, stride_kc_offset, stride_kc_head,
    stride_vc_block, stride_vc_offset, stride_vc_head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    # One program per new token: copies its [num_kv_heads, head_dim] K and V rows.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # Padding tokens carry slot -1: every lane is masked off, nothing is read or written.
    # (A tensor mask, not `& (slot >= 0)`: Triton's interpreter mis-types scalar-bool masks.)
    num_heads = tl.where(slot >= 0, NUM_KV_HEADS, 0)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < HEAD_DIM)

    # [BLOCK_H, BLOCK_D]
    k = tl.load(
        k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask
    )
    v = tl.load(
        v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask
    )
    kc = (
        k_cache_ptr
        + block * stride_kc_block
        + offset * stride_kc_offset
        + offs_h[:, None] * stride_kc_head
        + offs_d[None, :]
    )
    vc = (
        v_cache_ptr
        + block * stride_vc_block
        + offset * stride_vc_offset
        + offs_h[:, None] * stride_vc_head
        + offs_d[None, :]
    )
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "store_kv: k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_dim], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if k.dim() != 3 or k.shape != v.shape or k.shape[1:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"store_kv: k/v must both be [num_tokens, {num_kv_heads}, {head_dim}], "
            f"got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(
            f"store_kv: slot_mapping must be [{k.shape[0]}], got {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"store_kv: slot_mapping must be int64 (or int32), got {slot_mapping.dtype}"
        )
    if k.dtype != v.dtype or k.dtype not in _DTYPES:
        raise ValueError(f"store_kv: k/v must share a float dtype, got {k.dtype} and {v.dtype}")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in _DTYPES:
        raise ValueError(
            f"store_kv: caches must share a float dtype, got {k_cache.dtype} and {v_cache.dtype}"
        )
    devices = {t.device for t in (k, v, k_cache, v_cache, slot_mapping)}
    if len(devices) != 1:
        raise ValueError(f"store_kv: all tensors must be on one device, got {devices}")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"store_kv: {name} must have a unit-stride last dim, got {t.stride()}")
    if not slot_mapping.is_contiguous():
        raise ValueError("store_kv: slot_mapping must be contiguous")


def store_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; slots < 0 are skipped
) -> None:
    """Write k[i], v[i] into cache slot slot_mapping[i] (block * block_size + offset), cast to
    the cache dtype, in place. Tokens whose slot is negative (CUDA-graph padding) are skipped.
    k and v may be strided views (e.g. slices of a fused QKV output) if their last dim is
    contiguous; the caches may be views of the all-layer tensor."""
    _check(k, v, k_cache, v_cache, slot_mapping)
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    # fmt: off
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        num_warps=4,
    )
    # fmt: on
