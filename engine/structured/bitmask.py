"""A step's token bitmask: filled on the host (one int32 row per sampled request, bit t % 32 of
word t // 32 = token t allowed), copied up without waiting, and applied to the logits on the
device with plain tensor ops (nothing to compile while serving)."""

from __future__ import annotations

import torch

WORD_BITS = 32


def words_for(vocab_size: int) -> int:
    return -(-vocab_size // WORD_BITS)


class BitmaskBuffers:
    """Two host buffers used in turn, so a step's fill never overwrites the rows an earlier
    step's copy may still be reading (pinned on CUDA, for the non-blocking copy)."""

    def __init__(self, max_rows: int, vocab_size: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        shape = (max_rows, words_for(vocab_size))
        self._buffers = [torch.empty(shape, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._turn = 0

    def take(self, num_rows: int) -> torch.Tensor:
        """num_rows rows with every token allowed."""
        self._turn ^= 1
        rows = self._buffers[self._turn][:num_rows]
        rows.fill_(-1)
        return rows


def allow(bitmask: torch.Tensor, row: int, token_id: int) -> None:
    word, bit = divmod(token_id, WORD_BITS)
    value = int(bitmask[row, word]) | (1 << bit)
    bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [rows, vocab] with every token whose bit is clear set to -inf. bitmask: host
    int32 [rows, words]; moved to the logits' device without blocking."""
    mask = bitmask.to(logits.device, non_blocking=True)
    shifts = torch.arange(WORD_BITS, device=logits.device, dtype=torch.int32)
    bits = (mask.unsqueeze(-1) >> shifts) & 1  # [rows, words, 32]
    allowed = bits.view(mask.shape[0], -1)[:, : logits.shape[-1]].bool()
    return logits.masked_fill(~allowed, float("-inf"))
