"""Attention metadata of one forward pass, owned by the model runner and read by attention.

Models see `forward(input_ids, positions)`; attention layers read this context. Sequences in a
batch are packed along the token axis, decodes first: the first `num_decodes` sequences
contribute exactly one query token each, the rest are prefill chunks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class ImageSpan:
    """Rows [row_start, row_end) of the packed batch are placeholders of one image in the
    sequence `seq` (its index in the batch), at positions first_position..; the image's
    placeholders end at position key_end, within this step."""

    seq: int
    row_start: int
    row_end: int
    first_position: int
    key_end: int


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor
    """[num_tokens] int64: KV-cache slot (block * block_size + offset) of each new token."""
    query_start_loc: torch.Tensor
    """[num_seqs + 1] int32: where each sequence's query tokens start in the packed batch."""
    seq_lens: torch.Tensor
    """[num_seqs] int32: context length of each sequence including this step's tokens."""
    block_tables: torch.Tensor
    """[num_seqs, max_blocks] int32: KV block ids of each sequence (padding is 0)."""
    num_decodes: int
    """The first num_decodes sequences are single-token decodes."""
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    decode_num_splits: int | None = None
    """Fixed split count for decode attention (CUDA graphs); None = chosen per call."""
    state_slots: torch.Tensor | None = None
    """[num_seqs] int64: each sequence's state-pool slot (models with linear-attention layers,
    engine/memory/state_pool.py; -1: a CUDA-graph padding row); None for a model without them."""
    state_fresh: torch.Tensor | None = None
    """[num_seqs] bool: the sequence starts from a zero state (its first prefill chunk)
    instead of its slot's."""
    image_spans: list[ImageSpan] = field(default_factory=list)
    """The query rows of image placeholders this step, for models whose image tokens attend
    to each other both ways (engine/runner/vision_step.py)."""

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)


_context: AttentionMetadata | None = None


def get_context() -> AttentionMetadata:
    if _context is None:
        raise RuntimeError("attention called outside ModelRunner.forward (no context set)")
    return _context


@contextmanager
def forward_context(meta: AttentionMetadata) -> Iterator[None]:
    global _context
    previous, _context = _context, meta
    try:
        yield
    finally:
        _context = previous
