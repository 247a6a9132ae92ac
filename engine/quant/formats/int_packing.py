"""Integers packed in int32 words, as AWQ, GPTQ and compressed-tensors store them, unpacked; and
4-bit codes packed into our int4 bytes (engine/quant/weight_format.py: k even in the high
nibble).

Every format here packs 32 / bits values into a word from the least significant bits up: value
i of a word sits at bits [i * bits, (i + 1) * bits). Which tensor dimension the words run along,
and in which order a word's values map to columns (AWQ interleaves them), is each format's.
"""

from __future__ import annotations

import torch


def unpack_int32(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 [A, B] -> int32 [A * 32 / bits, B] (dim 0) or [A, B * 32 / bits] (dim 1): each
    word's values in bit order, unsigned (0 .. 2^bits - 1)."""
    if words.dtype != torch.int32 or words.dim() != 2:
        raise ValueError(
            f"packed weights must be int32 [rows, cols], got {words.dtype} {tuple(words.shape)}"
        )
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)  # [per_word]
    mask = (1 << bits) - 1
    if dim == 0:
        values = (words[:, None, :] >> shifts[None, :, None]) & mask  # [A, per_word, B]
        return values.reshape(words.shape[0] * per_word, words.shape[1])
    values = (words[:, :, None] >> shifts[None, None, :]) & mask  # [A, B, per_word]
    return values.reshape(words.shape[0], words.shape[1] * per_word)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 [N, K] (any integer dtype) -> our int4 bytes uint8 [N, K / 2], the even
    column in the high nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"int4 rows need an even width, got {codes.shape[-1]}")
    codes = codes.to(torch.uint8)
    return (codes[:, 0::2] << 4) | codes[:, 1::2]


def as_int8(codes: torch.Tensor, midpoint: int = 128) -> torch.Tensor:
    """Unsigned 8-bit codes (0..255) -> int8 less `midpoint`: the values our int8 layout holds
    (a zero point shifts by the same midpoint)."""
    return (codes.to(torch.int32) - midpoint).to(torch.int8)


def group_order(g_idx: torch.Tensor, group_size: int, num_groups: int) -> torch.Tensor | None:
    """GPTQ's g_idx (the group of each input column) -> the column order that puts each group's
    columns together (stable), or None when g_idx is already k // group_size. Raises unless
    every group holds group_size columns."""
    g_idx = g_idx.to(torch.int64)
    k = g_idx.numel()
    if torch.equal(g_idx, torch.arange(k, device=g_idx.device) // group_size):
        return None
    counts = torch.bincount(g_idx, minlength=num_groups)
    if counts.numel() != num_groups or bool((counts != group_size).any()):
        raise ValueError(
            f"g_idx puts {counts.tolist()[:8]}... columns in its groups; each of the "
            f"{num_groups} groups must hold {group_size}"
        )
    return torch.argsort(g_idx, stable=True)
