"""Triton kernel for rotate-half rotary embedding of q and k in place (apply_rope).

Computes what RotaryEmbedding (engine/models/rope_tables.py) computes, rounding where it rounds:
cos/sin cast to q's dtype, x * cos and rotate_half(x) * sin each rounded to that dtype, then
added. In fp16/bf16 the result is therefore bit-identical to the PyTorch (and Hugging Face)
version.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import pdl
from engine.kernels.launch_math import cdiv, next_power_of_2
from engine.kernels.rmsnorm import round_to

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SPLIT_BELOW_TOKENS = 64
"""Below this many tokens each program rotates 4 heads (a batch-1 decode took 3.3 us as one
program per token, H200 Llama-3-8B); above, one program does all q heads and one all k heads."""


@triton.jit
def _rope_one(
    x_ptr,
    stride_t,
    stride_h,
    token,
    head0,
    c1,
    c2,
    s1,
    s2,
    NUM_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # Rotates heads [head0, head0 + BLOCK_H) of x[token] ([NUM_HEADS, 2 * HALF]) in place;
    # c*/s* are [1, BLOCK_HALF] in x's dtype.
    dtype = x_ptr.dtype.element_ty
    offs_h = head0 + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HALF)
    ptr1 = x_ptr + token * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    ptr2 = ptr1 + HALF
    # [BLOCK_H, BLOCK_HALF], both halves loaded before either is overwritten
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr2, mask=mask, other=0.0).to(tl.float32)
    out1, out2 = rotate(x1, x2, c1, c2, s1, s2, dtype)
    tl.store(ptr1, out1.to(dtype), mask=mask)
    tl.store(ptr2, out2.to(dtype), mask=mask)


@triton.jit
def rotate(x1, x2, c1, c2, s1, s2, dtype: tl.constexpr):
    """x * cos + rotate_half(x) * sin on the halves (x1, x2), rotate_half(x) = cat(-x2, x1);
    each product is rounded to dtype, as in PyTorch. fp32 in, fp32 (dtype-valued) out."""
    out1 = round_to(round_to(x1 * c1, dtype) + round_to(-x2 * s1, dtype), dtype)
    out2 = round_to(round_to(x2 * c2, dtype) + round_to(x1 * s2, dtype), dtype)
    return out1, out2


@triton.jit
def cos_sin(
    pos_ptr,
    cos_ptr,
    sin_ptr,
    token,
    stride_cos,
    stride_sin,
    dtype: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """[1, BLOCK_HALF] each, rounded to dtype: the table's two halves at token's position
    (equal for a standard rotate-half table)."""
    pos = tl.load(pos_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    dmask = offs_d < HALF
    cos_row = cos_ptr + pos * stride_cos + offs_d
    sin_row = sin_ptr + pos * stride_sin + offs_d
    c1 = round_to(tl.load(cos_row, mask=dmask, other=0.0), dtype)[None, :]
    c2 = round_to(tl.load(cos_row + HALF, mask=dmask, other=0.0), dtype)[None, :]
    s1 = round_to(tl.load(sin_row, mask=dmask, other=0.0), dtype)[None, :]
    s2 = round_to(tl.load(sin_row + HALF, mask=dmask, other=0.0), dtype)[None, :]
    return c1, c2, s1, s2


# positions is a view into the step's one upload buffer at an offset of one int64 a token
# (engine/runner/input_prep.upload): its 16-byte alignment follows the token count's parity. It is
# read one scalar a program.
@triton.jit(do_not_specialize_on_alignment=["pos_ptr"])
def _rope_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)  # engine/kernels/pdl.py
    # Program (token, j): HEADS heads at that token's position, q heads first, then k heads
    # (few tokens: many small programs, so a batch-1 decode is not one program's latency).
    token = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    Q_BLOCKS: tl.constexpr = (NUM_Q_HEADS + HEADS - 1) // HEADS
    c1, c2, s1, s2 = cos_sin(
        pos_ptr,
        cos_ptr,
        sin_ptr,
        token,
        stride_cos,
        stride_sin,
        q_ptr.dtype.element_ty,
        HALF,
        BLOCK_HALF,
    )
    if j < Q_BLOCKS:
        _rope_one(
            q_ptr,
            stride_qt,
            stride_qh,
            token,
            j * HEADS,
            c1,
            c2,
            s1,
            s2,
            NUM_Q_HEADS,
            HALF,
            HEADS,
            BLOCK_HALF,
        )
    else:
        _rope_one(
            k_ptr,
            stride_kt,
            stride_kh,
            token,
            (j - Q_BLOCKS) * HEADS,
            c1,
            c2,
            s1,
            s2,
            NUM_K_HEADS,
            HALF,
            HEADS,
            BLOCK_HALF,
        )


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            "apply_rope: q must be [num_tokens, num_heads, head_dim] and k "
            f"[num_tokens, num_kv_heads, head_dim], got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    num_tokens, head_dim = q.shape[0], q.shape[2]
    if head_dim % 2:
        raise ValueError(f"apply_rope: head_dim must be even, got {head_dim}")
    if q.dtype != k.dtype or q.dtype not in _DTYPES:
        raise ValueError(f"apply_rope: q/k must share a float dtype, got {q.dtype} and {k.dtype}")
    if positions.dim() != 1 or positions.shape[0] != num_tokens:
        raise ValueError(
            f"apply_rope: positions must be [{num_tokens}], got {tuple(positions.shape)}"
        )
    if positions.dtype not in (torch.int64, torch.int32) or not positions.is_contiguous():
        raise ValueError(
            f"apply_rope: positions must be contiguous int64 (or int32), got {positions.dtype}"
        )
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[1] != head_dim:
        raise ValueError(
            f"apply_rope: cos/sin must both be [max_positions, {head_dim}], "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"apply_rope: cos/sin must be fp32, got {cos.dtype} and {sin.dtype}")
    devices = {t.device for t in (q, k, positions, cos, sin)}
    if len(devices) != 1:
        raise ValueError(f"apply_rope: all tensors must be on one device, got {devices}")
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"apply_rope: {name} must have a unit-stride last dim, got {t.stride()}"
            )
    if q.numel() and q.data_ptr() == k.data_ptr():
        raise ValueError("apply_rope: q and k must be different tensors (both are written)")


def heads_per_program(num_tokens: int, num_q_heads: int, num_k_heads: int) -> tuple[int, int]:
    """(heads each program rotates, programs per token: q blocks, then k blocks)."""
    most = next_power_of_2(max(num_q_heads, num_k_heads))
    heads = min(most, 4) if num_tokens < SPLIT_BELOW_TOKENS else most
    return heads, cdiv(num_q_heads, heads) + cdiv(num_k_heads, heads)


def apply_rope(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64 (or int32)
    cos: torch.Tensor,  # [max_positions, head_dim] fp32
    sin: torch.Tensor,  # [max_positions, head_dim] fp32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half RoPE, IN PLACE: q and k are overwritten with
    x * cos[pos] + rotate_half(x) * sin[pos] (rotate_half(x) = cat(-x2, x1)) and returned.

    q and k may be strided views (slices of a fused QKV output) if their last dim is
    contiguous; they must not overlap each other. positions are not bounds-checked (that
    would need a host sync): the caller keeps them in [0, max_positions). One launch for q
    and k, no host sync and no allocation, so the call can be captured in a CUDA graph."""
    _check(q, k, positions, cos, sin)
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return q, k
    num_k_heads = k.shape[1]
    heads, programs = heads_per_program(num_tokens, num_q_heads, num_k_heads)
    use_pdl = pdl.enabled(q)
    _rope_kernel[(num_tokens, programs)](
        q,
        k,
        positions,
        cos,
        sin,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        NUM_Q_HEADS=num_q_heads,
        NUM_K_HEADS=num_k_heads,
        HALF=head_dim // 2,
        HEADS=heads,
        BLOCK_HALF=next_power_of_2(head_dim // 2),
        PDL=use_pdl,
        num_warps=4 if heads > 4 else 1,
        launch_pdl=use_pdl,
    )
    return q, k
