"""Triton kernel for RMSNorm, optionally fused with the residual add (rms_norm).

Computes what RMSNorm (engine/models/layers.py) computes, rounding where it rounds: the
residual sum in the input dtype, the normalisation in fp32, the normalised row cast back to the
input dtype and only then multiplied by the weight (Hugging Face's order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import pdl
from engine.kernels.launch_math import next_power_of_2

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    # fp32 x rounded (to nearest even) to `dtype`, returned as fp32. bf16 is rounded by hand
    # because Triton's CPU interpreter truncates fp32 -> bf16 casts; a value this returns then
    # casts to `dtype` exactly in both modes. Shared with rope.py and silu_mul.py.
    if dtype == tl.bfloat16:
        u = x.to(tl.uint32, bitcast=True)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return u.to(tl.float32, bitcast=True)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    new_res_ptr,
    stride_xt,
    stride_xh,
    stride_rt,
    stride_rh,
    eps,
    NUM_HEADS: tl.constexpr,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,
):
    # One program per row; a row is x[t] (2-D input) or x[t, h] (3-D input, NUM_HEADS > 1).
    pdl.enter(PDL)  # engine/kernels/pdl.py
    row = tl.program_id(0).to(tl.int64)
    t = row // NUM_HEADS
    h = row % NUM_HEADS
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN

    # [BLOCK]
    dtype = x_ptr.dtype.element_ty
    out_dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + offs, mask=mask, other=0.0)
    x = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + t * stride_rt + h * stride_rh + offs, mask=mask, other=0.0)
        # The sum is rounded to the input dtype first, as x + residual is in PyTorch.
        x = round_to(x + r.to(tl.float32), dtype)
        tl.store(new_res_ptr + row * HIDDEN + offs, x.to(dtype), mask=mask)
    mean_sq = tl.sum(x * x, axis=0) / HIDDEN
    normed = round_to(x * tl.math.rsqrt(mean_sq + eps), dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    out = round_to(normed * w, out_dtype)
    tl.store(out_ptr + row * HIDDEN + offs, out.to(out_dtype), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dim() not in (2, 3):
        raise ValueError(
            f"rms_norm: x must be [num_tokens, hidden] or [num_tokens, num_heads, head_dim], "
            f"got {tuple(x.shape)}"
        )
    hidden = x.shape[-1]
    if x.dtype not in _DTYPES:
        raise ValueError(f"rms_norm: x must be fp16, bf16 or fp32, got {x.dtype}")
    if weight.dim() != 1 or weight.shape[0] != hidden:
        raise ValueError(f"rms_norm: weight must be [{hidden}], got {tuple(weight.shape)}")
    if weight.dtype not in _DTYPES:
        raise ValueError(f"rms_norm: weight must be fp16, bf16 or fp32, got {weight.dtype}")
    if not weight.is_contiguous():
        raise ValueError("rms_norm: weight must be contiguous")
    if x.stride(-1) != 1:
        raise ValueError(f"rms_norm: x must have a unit-stride last dim, got {x.stride()}")
    devices = {x.device, weight.device}
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(
                f"rms_norm: residual must match x's shape {tuple(x.shape)}, "
                f"got {tuple(residual.shape)}"
            )
        if residual.dtype != x.dtype:
            raise ValueError(
                f"rms_norm: residual dtype {residual.dtype} must match x dtype {x.dtype}"
            )
        if residual.stride(-1) != 1:
            raise ValueError(
                f"rms_norm: residual must have a unit-stride last dim, got {residual.stride()}"
            )
        devices.add(residual.device)
    if len(devices) != 1:
        raise ValueError(f"rms_norm: all tensors must be on one device, got {devices}")


def _row_strides(t: torch.Tensor) -> tuple[int, int]:
    return (t.stride(0), t.stride(1)) if t.dim() == 3 else (t.stride(0), 0)


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden] or [num_tokens, num_heads, head_dim]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # like x
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of each row of x (the last dim), scaled by weight.

    Without residual returns out; with it returns (out, new_residual) where
    new_residual = x + residual (in x's dtype) and out = rms_norm(new_residual) * weight.
    Nothing is written in place: out and new_residual are fresh contiguous tensors, and x and
    residual are only read. out has dtype promote_types(x.dtype, weight.dtype), as in PyTorch.
    x and residual may be strided views whose last dim is contiguous (e.g. q/k heads sliced
    from a fused QKV output, for Qwen3's per-head q/k norm). No host sync and no allocation
    beyond the outputs, so the call can be captured in a CUDA graph."""
    _check(x, weight, residual)
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    new_residual = (
        torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else None
    )
    num_heads = x.shape[1] if x.dim() == 3 else 1
    num_rows = x.shape[0] * num_heads
    if num_rows > 0:
        hidden = x.shape[-1]
        block = next_power_of_2(hidden)
        stride_xt, stride_xh = _row_strides(x)
        stride_rt, stride_rh = _row_strides(residual) if residual is not None else (0, 0)
        res = residual if residual is not None else x  # unread when HAS_RESIDUAL is False
        use_pdl = pdl.enabled(x)
        _rms_norm_kernel[(num_rows,)](
            x,
            res,
            weight,
            out,
            new_residual if new_residual is not None else out,
            stride_xt,
            stride_xh,
            stride_rt,
            stride_rh,
            float(eps),
            NUM_HEADS=num_heads,
            HIDDEN=hidden,
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            PDL=use_pdl,
            num_warps=min(max(block // 512, 1), 16),
            launch_pdl=use_pdl,
        )
    return out if new_residual is None else (out, new_residual)
