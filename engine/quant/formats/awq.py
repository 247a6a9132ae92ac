"""AWQ checkpoints (GEMM packing, 4-bit, zero points) -> our int4 with zero points.

Per projection of N outputs and K inputs, groups of G inputs:
- `qweight` int32 [K, N / 8]: a word holds 8 consecutive output columns' codes, interleaved:
  its value i (bits 4i .. 4i + 3) is column AWQ_ORDER[i] of the eight;
- `qzeros` int32 [K / G, N / 8], packed the same way: each group's zero point z (0..15);
- `scales` fp16 [K / G, N]: W[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n].
GEMV packing (words along K) is refused by engine/quant/checkpoints.py.
"""

from __future__ import annotations

import torch

from engine.quant.formats.int_packing import pack_int4, unpack_int32
from engine.quant.weight_format import WeightQuant

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Value i of a word holds column AWQ_ORDER[i] of its eight."""
_COLUMN_AT = tuple(AWQ_ORDER.index(c) for c in range(8))
"""Column c of a word's eight is its value _COLUMN_AT[c]."""


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C / 8] in AWQ's interleaved order -> codes int32 [R, C] in column order."""
    values = unpack_int32(words, 4, dim=1).view(words.shape[0], -1, 8)  # [R, C / 8, 8]
    return values[:, :, list(_COLUMN_AT)].reshape(words.shape[0], -1)


def convert_awq(prefix: str, parts: dict[str, torch.Tensor], quant: WeightQuant) -> dict:
    """One AWQ projection -> qweight uint8 [N, K / 2], scales and zeros fp32 [N, K / G]."""
    codes = unpack_awq(parts["qweight"]).t()  # [N, K]
    zeros = unpack_awq(parts["qzeros"]).t()  # [N, K / G]
    scales = parts["scales"].float().t()  # [N, K / G]
    n, k = codes.shape
    group = quant.group_size or k
    if scales.shape != (n, k // group) or zeros.shape != scales.shape:
        raise ValueError(
            f"{prefix}: AWQ scales {tuple(parts['scales'].shape)} and qzeros "
            f"{tuple(parts['qzeros'].shape)} do not fit a [{k}, {n}] weight in groups of {group}"
        )
    return {
        "qweight": pack_int4(codes),
        "scales": scales.contiguous(),
        "zeros": zeros.float().contiguous(),
    }
