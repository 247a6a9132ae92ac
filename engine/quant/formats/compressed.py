"""compressed-tensors pack-quantized checkpoints (W4A16 / W8A16, group or channel scales,
symmetric or not) -> our int4 or int8.

Per projection of N outputs and K inputs, B bits (4 or 8), groups of G inputs:
- `weight_packed` int32 [N, ceil(K * B / 32)]: words run along K, 32 / B values a word from the
  low bits up, each stored as q + 2^(B - 1) (q the signed code, -2^(B-1) .. 2^(B-1) - 1);
- `weight_scale` [N, K / G] (a channel: [N, 1]) in the checkpoint's dtype;
- `weight_zero_point` (asymmetric only) int32 [ceil(N * B / 32), K / G]: words run along N,
  signed zero points stored the same way;
- `weight_shape` int [2]: (N, K).
W[n, k] = (q[n, k] - zp[n, k // G]) * s[n, k // G]; zp = 0 where symmetric.
4-bit: symmetric codes take our integer table -8..7 (the stored q + 8 is the nibble);
asymmetric ones the table 0..15 with zeros = the stored zp + 8. 8-bit: int8 q, and zeros zp.
"""

from __future__ import annotations

import torch

from engine.quant.formats.int_packing import as_int8, pack_int4, unpack_int32
from engine.quant.weight_format import WeightQuant


def needed_parts(quant: WeightQuant) -> set[str]:
    parts = {"weight_packed", "weight_scale", "weight_shape"}
    return parts | ({"weight_zero_point"} if quant.zero_points else set())


def convert_packed(prefix: str, parts: dict[str, torch.Tensor], quant: WeightQuant) -> dict:
    """One pack-quantized projection -> our parts: qweight, scales and, asymmetric, zeros."""
    bits = 4 if quant.kind == "int4" else 8
    n, k = (int(d) for d in parts["weight_shape"].tolist())
    codes = unpack_int32(parts["weight_packed"], bits, dim=1)[:, :k]  # [N, K], q + 2^(B-1)
    scales = parts["weight_scale"].float()  # [N, K / G]
    group = quant.group_size or k
    if codes.shape != (n, k) or scales.shape != (n, k // group):
        raise ValueError(
            f"{prefix}: weight_packed {tuple(parts['weight_packed'].shape)} and weight_scale "
            f"{tuple(scales.shape)} do not fit a [{n}, {k}] weight in groups of {group}"
        )
    midpoint = 1 << (bits - 1)
    out = {}
    if bits == 4:
        out["qweight"] = pack_int4(codes)
    else:
        out["qweight"] = as_int8(codes, midpoint)
        if quant.group_size == 0 and not quant.zero_points:  # one scale per row
            scales = scales[:, 0]
    out["scales"] = scales.contiguous()
    if quant.zero_points:
        zp = unpack_int32(parts["weight_zero_point"], bits, dim=0)[:n]  # [N, K / G], zp + mid
        out["zeros"] = zp.float() - (0 if bits == 4 else midpoint)
    return out
