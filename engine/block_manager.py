"""BlockManager: bookkeeping of the paged KV cache (free list, reference counts, block tables).

It only answers questions and records facts: `can_allocate`, `allocate`, `free`, `fork`. A
failed allocation returns a value (None/False) and changes nothing; deciding what to preempt
is the scheduler's job. Blocks are ids into the KV pool owned by the model runner.

Sharing: `fork` lets two sequences point at the same blocks (reference counted). A write into
a shared block is copy-on-write: `allocate` hands back the (src, dst) block copies the runner
must make before it writes.
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

    def num_new_blocks(self, seq: HasBlockTable, num_computed: int, num_new: int) -> int:
        """Blocks `allocate` would take for writing tokens [num_computed, num_computed+num_new)."""
        grow = max(0, self.blocks_for(num_computed + num_new) - len(seq.block_table))
        return grow + len(self._shared_in_range(seq, num_computed, num_new))

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(
        self, seq: HasBlockTable, num_computed: int, num_new: int
    ) -> list[tuple[int, int]] | None:
        """Make `seq` able to write tokens [num_computed, num_computed + num_new).

        Grows the block table and un-shares (copy-on-write) shared blocks in that range.
        Returns the (src, dst) block copies to perform before writing, or None, changing
        nothing, when there are not enough free blocks.
        """
        table = seq.block_table
        if num_new == 1 and num_computed < len(table) * self.block_size:
            if self.ref_counts[table[num_computed // self.block_size]] == 1:
                return []  # a decode inside its own last block: the common case, nothing to do
        shared = self._shared_in_range(seq, num_computed, num_new)
        grow = max(0, self.blocks_for(num_computed + num_new) - len(seq.block_table))
        if not self.can_allocate(grow + len(shared)):
            return None
        copies = []
        for index in shared:
            src = seq.block_table[index]
            dst = self._take()
            self._release(src)
            seq.block_table[index] = dst
            copies.append((src, dst))
        seq.block_table.extend(self._take() for _ in range(grow))
        return copies

    def fork(self, parent: HasBlockTable, child: HasBlockTable) -> None:
        """Let `child` share all of `parent`'s blocks (child must hold none)."""
        if child.block_table:
            raise ValueError("fork target already holds blocks")
        for block in parent.block_table:
            self.ref_counts[block] += 1
        child.block_table = list(parent.block_table)

    def free(self, seq: HasBlockTable) -> None:
        """Drop `seq`'s references; blocks nobody references go back to the free list."""
        for block in seq.block_table:
            self._release(block)
        seq.block_table = []

    # --- internals -----------------------------------------------------------------------
    def _shared_in_range(self, seq: HasBlockTable, num_computed: int, num_new: int) -> list[int]:
        if num_new <= 0:
            return []
        first = num_computed // self.block_size
        last = min(len(seq.block_table), self.blocks_for(num_computed + num_new))
        return [i for i in range(first, last) if self.ref_counts[seq.block_table[i]] > 1]

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
