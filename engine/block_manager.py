"""BlockManager: bookkeeping of the paged KV cache (free list, reference counts, block tables).

It only answers questions and records facts: `can_allocate`, `allocate`, `free`. A failed
allocation returns False and changes nothing; deciding what to preempt is the scheduler's job.
Blocks are ids into the KV pool owned by the model runner.

Blocks are reference counted: `free` drops a sequence's references, and a block goes back to
the free list when its count reaches zero.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol


class HasBlockTable(Protocol):
    block_table: list[int]


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, seq: HasBlockTable, num_tokens: int) -> bool:
        """Grow `seq`'s block table to hold its first `num_tokens` tokens. Returns False,
        changing nothing, when there are not enough free blocks."""
        grow = self.blocks_for(num_tokens) - len(seq.block_table)
        if grow <= 0:
            return True
        if not self.can_allocate(grow):
            return False
        seq.block_table.extend(self._take() for _ in range(grow))
        return True

    def free(self, seq: HasBlockTable) -> None:
        """Drop `seq`'s references; blocks nobody references go back to the free list."""
        for block in seq.block_table:
            self._release(block)
        seq.block_table = []

    # --- internals -----------------------------------------------------------------------
    def _take(self) -> int:
        block = self._free.popleft()
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        count = self.ref_counts[block]
        if count <= 0:
            raise RuntimeError(f"double free of KV block {block}")
        self.ref_counts[block] = count - 1
        if count == 1:
            self._free.append(block)
