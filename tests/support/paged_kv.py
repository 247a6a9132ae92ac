"""Random paged-KV block tables for kernel tests: the layout every attention test starts from."""

from __future__ import annotations

import torch


def paged_tables(seq_lens, block_size: int, gen, spare: int):
    """(num_blocks, tables [num_seqs, max_blocks + 1] int32, slots [total tokens]): each
    sequence's blocks drawn from a permuted pool (block 0 is the padding block, never drawn),
    one extra padding column per table; slots are the live tokens' cache slots in order."""
    blocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(blocks) + spare
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks, default=0) + 1, dtype=torch.int32)
    slots = []
    for i, (n, b) in enumerate(zip(seq_lens, blocks, strict=True)):
        tables[i, :b] = torch.tensor(perm[:b], dtype=torch.int32)
        perm = perm[b:]
        t = torch.arange(n)
        slots += (tables[i, t // block_size].long() * block_size + t % block_size).tolist()
    return num_blocks, tables, slots
