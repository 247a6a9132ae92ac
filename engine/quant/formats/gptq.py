"""GPTQ checkpoints (4 or 8 bits, symmetric or not, desc_act) -> our int4 or int8.

Per projection of N outputs and K inputs, B bits, groups of G inputs (G = K for group_size
-1), values packed 32 / B to an int32 from the low bits up:
- `qweight` int32 [K * B / 32, N]: words run along K (the input);
- `qzeros` int32 [K / G, N * B / 32]: words run along N; each group's zero point;
- `scales` fp16 [K / G, N];
- `g_idx` int32 [K]: the group of each input column (desc_act orders columns by activation
  size, so a group's columns are scattered; without desc_act g_idx = k // G).
W[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n], where z is the stored zero point plus
one in checkpoint_format "gptq" (v1: the quantizer stored z - 1) and as stored in "gptq_v2".
Symmetric checkpoints (sym) have z = 2^(B - 1) everywhere: 4-bit codes then take the integer
table -8..7 (no zero points, the kernels read it) and 8-bit codes become int8 q - 128.
desc_act: the columns are put in group order (perm, applied to x at run time).
"""

from __future__ import annotations

import torch

from engine.quant.formats.int_packing import as_int8, group_order, pack_int4, unpack_int32
from engine.quant.weight_format import WeightQuant

LATE_PARTS = {"g_idx"}
"""A part that may come after the others (then it must be k // G: no desc_act)."""


def needed_parts(quant: WeightQuant) -> set[str]:
    """The parts a projection completes with: g_idx too where desc_act may have scattered it."""
    return {"qweight", "qzeros", "scales"} | ({"g_idx"} if "desc_act" in quant.variant else set())


def convert_gptq(prefix: str, parts: dict[str, torch.Tensor], quant: WeightQuant) -> dict:
    """One GPTQ projection -> our parts: qweight, scales, zeros (asymmetric) and perm
    (desc_act)."""
    bits = 4 if quant.kind == "int4" else 8
    codes = unpack_int32(parts["qweight"], bits, dim=0).t()  # [N, K]
    zeros = unpack_int32(parts["qzeros"], bits, dim=1).t()  # [N, K / G]
    if quant.variant.startswith("v1"):
        zeros = (zeros + 1) & ((1 << bits) - 1)
    scales = parts["scales"].float().t().contiguous()  # [N, K / G]
    n, k = codes.shape
    group = quant.group_size or k
    if scales.shape != (n, k // group) or zeros.shape[1] != scales.shape[1]:
        raise ValueError(
            f"{prefix}: GPTQ scales {tuple(parts['scales'].shape)} do not fit a [{k}, {n}] "
            f"weight in groups of {group}"
        )
    zeros = zeros[:n]  # the last word of a row may be padding
    out = {}
    if "g_idx" in parts:
        perm = group_order(parts["g_idx"], group, k // group)
        if perm is not None:
            codes, out["perm"] = codes[:, perm], perm
    midpoint = 1 << (bits - 1)
    if not quant.zero_points and bool((zeros != midpoint).any()):
        raise ValueError(
            f"{prefix}: a symmetric (sym) GPTQ checkpoint whose zero points are not all "
            f"{midpoint}; its config's sym or checkpoint_format is wrong"
        )
    if bits == 4:
        out["qweight"] = pack_int4(codes)
    else:
        out["qweight"] = as_int8(codes)
        if quant.group_size == 0 and not quant.zero_points:  # one scale per row
            scales = scales[:, 0].contiguous()
    out["scales"] = scales
    if quant.zero_points:
        out["zeros"] = zeros.float() - (0 if bits == 4 else midpoint)
    return out
