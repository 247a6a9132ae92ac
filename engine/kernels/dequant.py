"""Triton dequantization of int8 / int4 (NF4, FP4) weights to 16 bits, in one pass.

A batch of more than a few rows (engine/quant/dispatch.py, DEQUANT_MIN_ROWS) dequantizes each
weight to x's dtype before cuBLAS, in every step, so this pass is part of every batched step
and every prefill. dequantize_to (engine/quant/reference.py) does it in PyTorch: int8 in one
op (read 1 byte, write 2, a weight), int4 in four (the codes as int32, a gather into an fp32
copy, the scale, the 16-bit write: about 14 bytes of traffic a weight). This kernel reads the
packed weight and its scales and writes the 16-bit weight: 2.5 bytes a weight for int4, the
same values bit for bit (each product code-or-int8 x scale in fp32, rounded once as it is
written).

Start-up timing (engine/quant/quant_choices.py) keeps it, per weight shape, only where it gave
dequantize_to's bits and was faster on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.launch_math import cdiv

BLOCK_N, BLOCK_K, NUM_WARPS = 16, 256, 4  # a program writes BLOCK_N x BLOCK_K 16-bit weights


@triton.jit
def _dequant_kernel(
    q_ptr,
    s_ptr,
    code_ptr,
    out_ptr,
    N,
    K,
    stride_qn,
    stride_sn,
    stride_on,
    GROUP: tl.constexpr,
    IS_INT4: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[:, None]
    dtype = out_ptr.dtype.element_ty
    if IS_INT4:  # byte j holds the code of column 2j in its high nibble, 2j + 1 in its low one
        HALF: tl.constexpr = BLOCK_K // 2
        offs_b = tl.program_id(1) * HALF + tl.arange(0, HALF)
        mask = n_mask[:, None] & (offs_b < K // 2)[None, :]
        packed = tl.load(q_ptr + rows * stride_qn + offs_b[None, :], mask=mask, other=0)
        packed = packed.to(tl.int32)
        cols = (2 * offs_b // GROUP)[None, :]  # both columns of a byte share a group (even)
        scale = tl.load(s_ptr + rows * stride_sn + cols, mask=mask, other=0.0)
        high = (tl.load(code_ptr + (packed >> 4)) * scale).to(dtype)
        low = (tl.load(code_ptr + (packed & 0xF)) * scale).to(dtype)
        w = tl.reshape(tl.join(high, low), (BLOCK_N, BLOCK_K))  # columns 2j, 2j + 1
    else:
        scale = tl.load(s_ptr + offs_n * stride_sn, mask=n_mask, other=0.0)[:, None]
        offs_q = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = n_mask[:, None] & (offs_q < K)[None, :]
        q = tl.load(q_ptr + rows * stride_qn + offs_q[None, :], mask=mask, other=0)
        w = (q.to(tl.float32) * scale).to(dtype)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = n_mask[:, None] & (offs_k < K)[None, :]
    tl.store(out_ptr + rows * stride_on + offs_k[None, :], w, mask=mask)


def dequantize(
    qweight: torch.Tensor,  # int8 [N, K] or packed int4 uint8 [N, K / 2], unit stride along K
    scales: torch.Tensor,  # fp32 [N] (int8) or [N, K / group] (int4), unit stride along K
    code: torch.Tensor | None,  # fp32 [16] (int4)
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:  # [N, K] in dtype
    """The weight in `dtype`, equal to dequantize_to's (the caller checked it with supports())."""
    is_int4 = qweight.dtype == torch.uint8
    n, k = qweight.shape[0], qweight.shape[1] * (2 if is_int4 else 1)
    out = torch.empty(n, k, dtype=dtype, device=qweight.device)
    grid = (cdiv(n, BLOCK_N), cdiv(k, BLOCK_K))
    _dequant_kernel[grid](
        qweight,
        scales,
        code if is_int4 else scales,
        out,
        n,
        k,
        qweight.stride(0),
        scales.stride(0),
        out.stride(0),
        GROUP=group_size if is_int4 else 1,
        IS_INT4=is_int4,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        num_warps=NUM_WARPS,
    )
    return out


def supports(qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> bool:
    """The layouts the kernel reads: unit stride along K, and for int4 an even group that
    divides K."""
    if qweight.stride(-1) != 1 or scales.stride(-1) != 1:
        return False
    if qweight.dtype == torch.uint8:
        return group_size >= 2 and group_size % 2 == 0 and (2 * qweight.shape[1]) % group_size == 0
    return qweight.dtype == torch.int8
