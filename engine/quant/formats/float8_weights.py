"""FP8 e4m3 checkpoints -> our fp8 layout (float8_e4m3fn [N, K] with fp32 scales
[N, ceil(K / G)], engine/quant/weight_format.py).

Both compressed-tensors float-quantized and quant_method "fp8" store `weight` float8_e4m3fn
[N, K] and a multiplier, W = weight * scale:
- per tensor: `weight_scale` [] or [1] -> repeated on every row (the fused Q/K/V or gate/up
  rows each keep their own projection's);
- per channel: `weight_scale` [N, 1];
- block (R x C, DeepSeek's 128 x 128): `weight_scale` (compressed-tensors) or
  `weight_scale_inv` (fp8; despite the name, also a multiplier) [ceil(N / R), ceil(K / C)] ->
  each block row's scales repeated on its R rows, so fused rows stay rows.
`input_scale` (static activation scales) is dropped: activations are scaled per token.
"""

from __future__ import annotations

import torch

from engine.quant.weight_format import WeightQuant

SCALE_NAMES = ("weight_scale", "weight_scale_inv")


def block_shape(quant: WeightQuant) -> tuple[int, int] | None:
    """(R, C) of a "block:RxC" variant; None for per-tensor or per-channel scales."""
    if not quant.variant.startswith("block:"):
        return None
    rows, cols = quant.variant.removeprefix("block:").split("x")
    return int(rows), int(cols)


def convert_fp8(prefix: str, parts: dict[str, torch.Tensor], quant: WeightQuant) -> dict:
    """One FP8 projection -> qweight float8_e4m3fn [N, K] and scales fp32 [N, groups]."""
    weight = parts["weight"]
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{prefix}.weight is {weight.dtype}, expected float8_e4m3fn")
    scale = next(parts[s] for s in SCALE_NAMES if s in parts).float()
    n, k = weight.shape
    block = block_shape(quant)
    if block is None:
        if scale.numel() == 1:
            scale = scale.reshape(1, 1).expand(n, 1)
        want = (n, 1)
    else:
        rows, cols = block
        want = (-(-n // rows), -(-k // cols))
        if tuple(scale.shape) == want:
            scale = scale.repeat_interleave(rows, dim=0)[:n]
            want = (n, want[1])
    if tuple(scale.shape) != want:
        raise ValueError(
            f"{prefix}: FP8 scale {tuple(parts[next(s for s in SCALE_NAMES if s in parts)].shape)}"
            f" does not fit a [{n}, {k}] weight ({quant.variant} scales)"
        )
    return {"qweight": weight, "scales": scale.contiguous()}
