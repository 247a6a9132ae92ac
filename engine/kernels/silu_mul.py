"""Triton kernel for the gated MLP activation silu(gate) * up (silu_and_mul).

Computes what silu_and_mul (engine/models/layers.py) computes, rounding where it rounds:
silu(gate) in fp32 rounded to x's dtype, then the product with up in fp32 rounded to x's
dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import pdl
from engine.kernels.launch_math import cdiv, next_power_of_2
from engine.kernels.rmsnorm import round_to

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(
    x_ptr,
    out_ptr,
    stride_xt,
    INTERMEDIATE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)  # engine/kernels/pdl.py
    # Program (token, j) handles columns [j * BLOCK, (j + 1) * BLOCK) of one token's output.
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTERMEDIATE
    dtype = x_ptr.dtype.element_ty
    row = x_ptr + token * stride_xt
    # [BLOCK]
    gate = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + INTERMEDIATE + offs, mask=mask, other=0.0).to(tl.float32)
    act = round_to(gate / (1.0 + tl.exp(-gate)), dtype)
    out = round_to(act * up, dtype)
    tl.store(out_ptr + token * INTERMEDIATE + offs, out.to(dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens, 2 * intermediate]
    """silu(x[:, :I]) * x[:, I:] -> fresh contiguous [num_tokens, I] in x's dtype (nothing in
    place). x's rows may be strided (e.g. a slice of a bigger buffer) if its last dim is
    contiguous. No host sync and no allocation beyond the output (CUDA-graph safe)."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(
            f"silu_and_mul: x must be [num_tokens, 2 * intermediate], got {tuple(x.shape)}"
        )
    if x.dtype not in _DTYPES:
        raise ValueError(f"silu_and_mul: x must be fp16, bf16 or fp32, got {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError(f"silu_and_mul: x must have a unit-stride last dim, got {x.stride()}")
    num_tokens, intermediate = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_tokens, intermediate, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    block = min(_BLOCK, next_power_of_2(intermediate))
    grid = (num_tokens, cdiv(intermediate, block))
    use_pdl = pdl.enabled(x)
    _silu_mul_kernel[grid](
        x,
        out,
        x.stride(0),
        INTERMEDIATE=intermediate,
        BLOCK=block,
        PDL=use_pdl,
        num_warps=4,
        launch_pdl=use_pdl,
    )
    return out
