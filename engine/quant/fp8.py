"""FP8 (e4m3) weights read from a checkpoint: the matmul with activations scaled per token
(torch._scaled_mm, on GPUs with FP8 tensor cores), and the weight-only path everywhere else.

W8A8 path: x [M, K] is quantized per token, s_x[m] = max|x[m, :]| / FP8_MAX, and
y = _scaled_mm(x / s_x, W.T, s_x, s_w) + bias, which computes sum_k xq[m, k] wq[n, k] times
s_x[m] s_w[n]. It needs one scale per output row (per-channel or per-tensor checkpoints;
block-scaled weights take the weight-only path) and both widths multiples of 16 (cuBLASLt).
Weight-only path: the weight dequantized to x's dtype (reference.dequantize_to), then F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.quant.reference import dequantize_to
from engine.quant.weight_format import QuantizedWeight

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
"""The largest finite e4m3 value."""
MIN_CAPABILITY = (8, 9)
"""FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards."""


def can_scaled_mm(w: QuantizedWeight, device: torch.device) -> bool:
    """The W8A8 path serves this weight on `device`: CUDA with FP8 tensor cores, one scale per
    output row, widths multiples of 16. False on a CPU (start-up decides; nothing is tried
    while a step runs)."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    if torch.cuda.get_device_capability(device) < MIN_CAPABILITY:
        return False
    n, k = w.qweight.shape
    return w.scales.shape[1] == 1 and n % 16 == 0 and k % 16 == 0


def fp8_linear(x: torch.Tensor, w: QuantizedWeight, scaled_mm: bool) -> torch.Tensor:
    """x [..., K] @ W.T + bias -> [..., N] in x's dtype: by the W8A8 path where start-up found
    it serves the weight (`scaled_mm`), else by the weight-only path."""
    if scaled_mm and x.is_cuda:
        return _scaled(x, w)
    return F.linear(x, dequantize_to(w.qweight, w.scales, None, w.group_size, x.dtype), w.bias)


def _scaled(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    x_scale = (x2.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)  # [M, 1]
    xq = (x2.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [M, K]
    out = torch._scaled_mm(
        xq,
        w.qweight.t(),  # [K, N], column-major as cuBLASLt wants it
        scale_a=x_scale,
        scale_b=w.scales.reshape(1, -1),  # [1, N]
        bias=w.bias,
        out_dtype=x.dtype,
    )
    return out.view(*x.shape[:-1], -1)


def fp8_matches(w: QuantizedWeight, dtype: torch.dtype, rows: int = 4) -> bool:
    """Start-up check on the device: the W8A8 path agrees with the weight-only one on random
    activations within FP8's rounding of x (2^-4 relative, measured by the largest output)."""
    x = torch.randn(rows, w.in_features, dtype=dtype, device=w.qweight.device)
    try:
        got = _scaled(x, w).float()
    except (RuntimeError, NotImplementedError):
        return False
    want = fp8_linear(x, w, scaled_mm=False).float()
    return bool((got - want).abs().max() <= 2**-4 * want.abs().max())
