"""Pure-PyTorch references for quantized weights (layouts: engine/quant/weight_format.py): the
dequantization and the matmul every quantized kernel is tested against, and what runs where
there is no CUDA or no Triton, or no kernel reads the layout (zero points, grouped int8, fp8).
They take the weight's tensors as the kernels do; zero points by keyword."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dequantize_ref(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    code: torch.Tensor | None,
    group_size: int,
    zeros: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pure-PyTorch dequantization to fp32 [N, K] (the kernel's reference)."""
    return dequantize_to(qweight, scales, code, group_size, torch.float32, zeros)


def dequantize_to(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    code: torch.Tensor | None,
    group_size: int,
    dtype: torch.dtype,
    zeros: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weight as `dtype` [N, K]: each product (code-or-int8 less its zero point) x scale
    computed in fp32 and rounded once as it is written (int8 with row scales: no fp32 copy at
    all; int4: one, for the looked-up codes). Batches of more than a few rows take this path on
    a GPU before cuBLAS, so its temporaries are the layer's activation peak."""
    if qweight.dtype == torch.int8 and scales.dim() == 1 and zeros is None:
        out = torch.empty(qweight.shape, dtype=dtype, device=qweight.device)
        return torch.mul(qweight, scales[:, None], out=out)
    if code is None:  # int8 or fp8, one scale per group of a row (the last group may be short)
        n, k = qweight.shape
        values = qweight.float()  # [N, K]
        if zeros is not None:
            values -= zeros.repeat_interleave(group_size, dim=1)[:, :k]
        out = torch.empty(n, k, dtype=dtype, device=qweight.device)
        return torch.mul(values, scales.repeat_interleave(group_size, dim=1)[:, :k], out=out)
    n, groups = scales.shape
    # byte b -> (code[b >> 4], code[b & 15]): one lookup yields both weights of a byte
    pairs = torch.stack([code.repeat_interleave(16), code.repeat(16)], dim=-1)  # [256, 2]
    values = pairs[qweight.int()].view(n, groups, group_size)  # [N, K / group, group]
    if zeros is not None:
        values = values - zeros[:, :, None]
    out = torch.empty(values.shape, dtype=dtype, device=qweight.device)
    return torch.mul(values, scales[:, :, None], out=out).view(n, -1)


def wq_matmul_ref(x, qweight, scales, code=None, bias=None, group_size: int = 64, zeros=None):
    """x @ dequant(W).T + bias, with the weight rounded to x's dtype (as bitsandbytes does)."""
    w = dequantize_to(qweight, scales, code, group_size, x.dtype, zeros)
    return F.linear(x, w, bias)
