"""Which kernel serves a quantized linear, by the rows (tokens) of x: the one table.

On CUDA with Triton:

| rows    | path                                                                             |
|---------|----------------------------------------------------------------------------------|
| 1       | split-K GEMV (kernels/wq_gemv.py) at the config timed for the shape; else the    |
|         | tl.dot GEMM (kernels/wq_matmul.py)                                               |
| 2-16    | decode-batch GEMM (kernels/wq_gemm.py) where timed faster for the shape and row  |
|         | bucket; else the tl.dot GEMM                                                     |
| 17-256  | decode-batch GEMM where timed faster; else dequantize + cuBLAS                   |
| > 256   | dequantize + cuBLAS (prefill: the tl.dot GEMM measured far slower there, H200)   |

"Dequantize" is the one-pass Triton kernel (kernels/dequant.py) where it was timed faster than
PyTorch's reference.dequantize_to for the shape, else dequantize_to: the same values either
way. Off CUDA, or without Triton, every row count takes reference.wq_matmul_ref. A gate-and-up
projection at one row may also fold silu_and_mul into the GEMV (fused_silu).

Nothing here times anything: each module holds its QuantKernels, which start-up timing
(engine/quant/quant_choices.py) filled; the default (nothing timed) takes the paths that need no
choice. Kernel modules are imported on use: without Triton none is imported.

Weights read from checkpoints: a GPTQ desc_act weight gathers x's columns into its stored order
first (QuantizedWeight.perm), then takes the table. Layouts no kernel reads yet (zero points,
int8 with group scales) are dequantized to x's dtype and multiplied by F.linear at every row
count; fp8 weights take engine/quant/fp8.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.kernels import triton_available
from engine.quant.fp8 import fp8_linear
from engine.quant.reference import dequantize_to, wq_matmul_ref
from engine.quant.weight_format import QuantizedWeight

DEQUANT_MIN_ROWS = 16
"""Above this many rows, where the decode-batch GEMM was not kept, the weight is dequantized to
16 bits and cuBLAS runs the GEMM."""


@dataclass
class QuantKernels:
    """The kernels start-up timing chose for one quantized linear's weight shape, for
    activations of `dtype` (another dtype takes the default paths)."""

    dtype: torch.dtype | None = None
    """The activation dtype the choices were timed for; None: nothing was timed."""
    gemv: tuple | None = None
    """The split-K GEMV's config at one row (kernels/wq_gemv.CONFIGS); None: the tl.dot GEMM."""
    gemv_silu: tuple | None = None
    """gate_up: wq_gemv_silu's config where it beat the GEMV then silu_and_mul; else None."""
    dequant: bool = False
    """Dequantize before cuBLAS by the Triton pass (True) or by dequantize_to."""
    gemm: dict[int, tuple] = field(default_factory=dict)
    """Row bucket (kernels/wq_gemm.BUCKETS) -> the decode-batch GEMM's config, where it won."""
    scaled_mm: bool = False
    """fp8: the W8A8 torch._scaled_mm path serves the weight (else weight-only)."""


NOTHING_TIMED = QuantKernels()


def kernels_run_on(x: torch.Tensor) -> bool:
    """The table's kernel paths serve x: it is on CUDA and Triton runs there."""
    return x.is_cuda and triton_available()


def quant_linear(x: torch.Tensor, w: QuantizedWeight, kernels: QuantKernels) -> torch.Tensor:
    """x [..., K] @ dequant(W).T + bias -> [..., N] in x's dtype, by the module docstring's
    table."""
    if w.perm is not None:
        x = x.index_select(-1, w.perm)
    if w.kind == "fp8":
        return fp8_linear(x, w, kernels.scaled_mm)
    if not w.is_kernel_layout:
        return wq_matmul_ref(x, *w.kernel_args(), zeros=w.zeros)
    if not kernels_run_on(x):
        return wq_matmul_ref(x, *w.kernel_args())
    if kernels.dtype != x.dtype:
        kernels = NOTHING_TIMED
    rows = x.numel() // x.shape[-1]
    if rows > 1 and kernels.gemm:
        from engine.kernels import wq_gemm

        config = kernels.gemm.get(wq_gemm.bucket_for(rows))
        x2 = x.reshape(-1, x.shape[-1])
        if config is not None and wq_gemm.supports(w.qweight, w.scales, x2, w.group_size):
            return wq_gemm.wq_gemm(x2, *w.kernel_args(), config).view(*x.shape[:-1], -1)
    return without_gemm(x, w, kernels)


def without_gemm(x: torch.Tensor, w: QuantizedWeight, kernels: QuantKernels) -> torch.Tensor:
    """The table's paths other than the decode-batch GEMM (CUDA with Triton): what start-up
    timing compares the GEMM against."""
    rows = x.numel() // x.shape[-1]
    if rows > DEQUANT_MIN_ROWS:
        return F.linear(x, dequantized(w, x.dtype, kernels.dequant), w.bias)
    if rows == 1 and kernels.gemv is not None:
        from engine.kernels import wq_gemv

        x2 = x.reshape(1, -1)
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        if wq_gemv.supports(w.qweight, x2, w.group_size):
            out = wq_gemv.wq_gemv(x2, *w.kernel_args(), kernels.gemv)
            return out.view(*x.shape[:-1], -1)
    from engine.kernels.wq_matmul import wq_matmul

    return wq_matmul(x, *w.kernel_args())


def dequantized(w: QuantizedWeight, dtype: torch.dtype, by_kernel: bool) -> torch.Tensor:
    """The weight in `dtype` [N, K] for a cuBLAS GEMM: by the Triton pass (by_kernel, where
    timing kept it and the layout suits it) or by dequantize_to; the same values."""
    args = (w.qweight, w.scales, w.code, w.group_size, dtype)
    if by_kernel:
        from engine.kernels import dequant

        if dequant.supports(w.qweight, w.scales, w.group_size):
            return dequant.dequantize(*args)
    return dequantize_to(*args)


def fused_silu(x: torch.Tensor, w: QuantizedWeight, kernels: QuantKernels) -> torch.Tensor | None:
    """silu_and_mul(x @ W.T + bias) for a gate-and-up weight in one kernel: one CUDA row where
    start-up timing kept wq_gemv_silu for the shape. None: the caller runs the two steps."""
    config = kernels.gemv_silu
    if w.perm is not None or not w.is_kernel_layout:
        return None
    if config is None or kernels.dtype != x.dtype or x.dim() != 2 or x.shape[0] != 1:
        return None
    if not kernels_run_on(x):
        return None
    from engine.kernels import wq_gemv

    if not wq_gemv.supports(w.qweight, x, w.group_size):
        return None
    return wq_gemv.wq_gemv_silu(x, *w.kernel_args(), config)
