"""Pure-PyTorch references for quantized weights (layouts: engine/quant/weight_format.py): the
dequantization and the matmul every quantized kernel is tested against, and what runs where
there is no CUDA or no Triton. They take the weight's tensors as the kernels do."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dequantize_ref(
    qweight: torch.Tensor, scales: torch.Tensor, code: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """Pure-PyTorch dequantization to fp32 [N, K] (the kernel's reference)."""
    return dequantize_to(qweight, scales, code, group_size, torch.float32)


def dequantize_to(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    code: torch.Tensor | None,
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The weight as `dtype` [N, K]: each product code-or-int8 x scale computed in fp32 and
    rounded once as it is written (int8: no fp32 copy at all; int4: one, for the looked-up
    codes). Batches of more than a few rows take this path on a GPU before cuBLAS, so its
    temporaries are the layer's activation peak."""
    if qweight.dtype == torch.int8:
        out = torch.empty(qweight.shape, dtype=dtype, device=qweight.device)
        return torch.mul(qweight, scales[:, None], out=out)
    n, groups = scales.shape
    # byte b -> (code[b >> 4], code[b & 15]): one lookup yields both weights of a byte
    pairs = torch.stack([code.repeat_interleave(16), code.repeat(16)], dim=-1)  # [256, 2]
    values = pairs[qweight.int()].view(n, groups, group_size)  # [N, K / group, group]
    out = torch.empty(values.shape, dtype=dtype, device=qweight.device)
    return torch.mul(values, scales[:, :, None], out=out).view(n, -1)


def wq_matmul_ref(x, qweight, scales, code=None, bias=None, group_size: int = 64):
    """x @ dequant(W).T + bias, with the weight rounded to x's dtype (as bitsandbytes does)."""
    w = dequantize_to(qweight, scales, code, group_size, x.dtype)
    return F.linear(x, w, bias)
