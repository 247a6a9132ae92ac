"""Triton kernel that writes this step's new K/V rows into the paged KV cache (store_kv), and
quantizes them to int8 with one fp16 scale per token and head for an int8 cache (the formula
of engine/kernels/torch_ref.quantize_kv_ref)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import pdl
from engine.kernels.kv_scales import check_kv_scales
from engine.kernels.launch_math import next_power_of_2

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _quantize_rows(x):
    """[BLOCK_H, BLOCK_D] values -> (int8-valued fp32 rows, fp16 scale per row)."""
    x = x.to(tl.float32)
    scale = tl.minimum(tl.max(tl.abs(x), 1) / 127.0, 65504.0).to(tl.float16)
    s32 = scale.to(tl.float32)
    inv = tl.where(s32 > 0.0, 1.0 / tl.where(s32 > 0.0, s32, 1.0), 0.0)
    y = x * inv[:, None]
    q = tl.where(y >= 0.0, tl.floor(y + 0.5), tl.ceil(y - 0.5))
    return tl.minimum(tl.maximum(q, -127.0), 127.0), scale


# slot_mapping is a view into the step's one upload buffer, at an offset that depends on the
# step's token count; it is read one scalar a program.
@triton.jit(do_not_specialize_on_alignment=["slot_ptr"])
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kc_block,
    stride_kc_offset,
    stride_kc_head,
    stride_vc_block,
    stride_vc_offset,
    stride_vc_head,
    stride_s_block,
    stride_s_offset,  # scales: unit head stride, K and V alike
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KV_INT8: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)  # engine/kernels/pdl.py
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
        k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :],
        mask=mask,
        other=0.0,
    )
    v = tl.load(
        v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :],
        mask=mask,
        other=0.0,
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
    if KV_INT8:
        k, k_scale = _quantize_rows(k)
        v, v_scale = _quantize_rows(v)
        s_off = block * stride_s_block + offset * stride_s_offset + offs_h
        tl.store(k_scale_ptr + s_off, k_scale, mask=offs_h < num_heads)
        tl.store(v_scale_ptr + s_off, v_scale, mask=offs_h < num_heads)
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scales: torch.Tensor | None,
    v_scales: torch.Tensor | None,
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
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (*_DTYPES, torch.int8):
        raise ValueError(
            "store_kv: caches must share a float or int8 dtype, got "
            f"{k_cache.dtype} and {v_cache.dtype}"
        )
    check_kv_scales("store_kv", k_cache, k_scales, v_scales)
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
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp16
    v_scales: torch.Tensor | None = None,  # (int8 caches only)
) -> None:
    """Write k[i], v[i] into cache slot slot_mapping[i] (block * block_size + offset), cast to
    the cache dtype, in place. Tokens whose slot is negative (CUDA-graph padding) are skipped.
    k and v may be strided views (e.g. slices of a fused QKV output) if their last dim is
    contiguous; the caches may be views of the all-layer tensor. An int8 cache stores each
    (token, head) row quantized and its scale in k_scales / v_scales at the same slot."""
    _check(k, v, k_cache, v_cache, slot_mapping, k_scales, v_scales)
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    is_int8 = k_scales is not None
    if not is_int8:  # placeholders, never read
        k_scales = v_scales = k_cache
    s_strides = k_scales.stride()[:2] if is_int8 else (0, 0)
    use_pdl = pdl.enabled(k)
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k_scales,
        v_scales,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        *s_strides,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=next_power_of_2(num_kv_heads),
        BLOCK_D=next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        KV_INT8=is_int8,
        PDL=use_pdl,
        num_warps=4,
        launch_pdl=use_pdl,
    )
