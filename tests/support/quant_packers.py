"""AWQ and GPTQ checkpoints written from the formats' public descriptions (not the libraries'
code): a weight quantized to integer codes with fp16 scales and zero points per group, packed
as each format stores it, plus the exact fp32 weight those tensors stand for.

- AWQ (GEMM): qweight int32 [K, N / 8], each word eight consecutive output columns' 4-bit codes
  in the interleaved order 0, 2, 4, 6, 1, 3, 5, 7 from the low bits up; qzeros int32
  [K / G, N / 8] the same way; scales fp16 [K / G, N]. W = (q - z) * s.
- GPTQ: qweight int32 [K * B / 32, N] (words along K), qzeros int32 [K / G, N * B / 32] (words
  along N; "gptq" v1 stores z - 1), scales fp16 [K / G, N], g_idx int32 [K] (with desc_act the
  columns of a group are scattered). sym puts z at 2^(B - 1).
"""

from __future__ import annotations

import torch

AWQ_INTERLEAVE = (0, 2, 4, 6, 1, 3, 5, 7)


def _words(values: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """[R, C] codes -> int32 [R, C * bits / 32]: consecutive columns into one word from the low
    bits up (value i of a word is column order[i] of its run)."""
    per = 32 // bits
    runs = values.to(torch.int64).view(values.shape[0], -1, per)  # [R, C / per, per]
    if order is not None:
        runs = runs[:, :, list(order)]
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    words = (runs << shifts).sum(-1)  # [R, C / per], 0 .. 2^32 - 1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _quantize(w: torch.Tensor, groups: torch.Tensor, num_groups: int, bits: int, sym: bool):
    """w fp32 [N, K], the group of each column -> (codes [N, K], scales fp16 [N, G], zeros
    [N, G]) from each row's group min / max."""
    top = (1 << bits) - 1
    lo = torch.stack([w[:, groups == g].amin(1) for g in range(num_groups)], 1).clamp(max=0)
    hi = torch.stack([w[:, groups == g].amax(1) for g in range(num_groups)], 1).clamp(min=0)
    if sym:
        scale = torch.maximum(-lo, hi) * 2 / top
        zeros = torch.full_like(scale, 1 << (bits - 1))
    else:
        scale = (hi - lo) / top
    scale = scale.clamp(min=1e-6).half()  # the stored scale is what the codes are made with
    if not sym:
        zeros = (-lo / scale.float()).round().clamp(0, top)
    s, z = scale.float()[:, groups], zeros[:, groups]  # [N, K]
    codes = ((w / s).round() + z).clamp(0, top)
    return codes.to(torch.int64), scale, zeros.to(torch.int64)


def dequantized(codes, scales, zeros, groups) -> torch.Tensor:
    """The exact fp32 weight: (q - z) * s, column k in group groups[k]."""
    return (codes - zeros[:, groups]).float() * scales.float()[:, groups]


def pack_awq(w: torch.Tensor, group: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """w fp32 [N, K] -> (AWQ GEMM tensors, the fp32 weight they stand for)."""
    n, k = w.shape
    groups = torch.arange(k) // group
    codes, scales, zeros = _quantize(w, groups, k // group, 4, sym=False)
    parts = {
        "qweight": _words(codes.t(), 4, AWQ_INTERLEAVE),
        "qzeros": _words(zeros.t(), 4, AWQ_INTERLEAVE),
        "scales": scales.t().contiguous(),
    }
    return parts, dequantized(codes, scales, zeros, groups)


def pack_gptq(
    w: torch.Tensor, bits: int, group: int, sym: bool, order: torch.Tensor | None, v1: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """w fp32 [N, K] -> (GPTQ tensors, the fp32 weight they stand for). order (desc_act): the
    columns in the order they were quantized; group g is order[g * group : (g + 1) * group]."""
    n, k = w.shape
    g_idx = torch.arange(k) // group
    if order is not None:
        g_idx = torch.empty_like(g_idx)
        g_idx[order] = torch.arange(k) // group
    codes, scales, zeros = _quantize(w, g_idx, k // group, bits, sym)
    stored = (zeros - 1) & ((1 << bits) - 1) if v1 else zeros
    parts = {
        "qweight": _words(codes, bits).t().contiguous(),  # [N, K * B / 32] -> words along K
        "qzeros": _words(stored.t(), bits),
        "scales": scales.t().contiguous(),
        "g_idx": g_idx.to(torch.int32),
    }
    return parts, dequantized(codes, scales, zeros, g_idx)
