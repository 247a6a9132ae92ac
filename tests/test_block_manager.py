"""The block manager never leaks, never double-frees and keeps reference counts right."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.block_manager import BlockManager

NUM_BLOCKS, BLOCK_SIZE = 16, 4


class Seq:
    def __init__(self) -> None:
        self.block_table: list[int] = []
        self.num_tokens = 0


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
        self.seqs: list[Seq] = []

    @rule(num_tokens=st.integers(1, 20))
    def allocate(self, num_tokens):
        seq = Seq()
        free_before = self.bm.num_free_blocks
        if not self.bm.allocate(seq, num_tokens):
            assert seq.block_table == [] and self.bm.num_free_blocks == free_before
            assert self.bm.blocks_for(num_tokens) > free_before
        else:
            assert len(seq.block_table) == self.bm.blocks_for(num_tokens)
            assert self.bm.num_free_blocks == free_before - len(seq.block_table)
            seq.num_tokens = num_tokens
            self.seqs.append(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), num_new=st.integers(1, 9))
    def append(self, data, num_new):
        seq = data.draw(st.sampled_from(self.seqs))
        before, free_before = list(seq.block_table), self.bm.num_free_blocks
        grow = self.bm.blocks_for(seq.num_tokens + num_new) - len(before)
        if not self.bm.allocate(seq, seq.num_tokens + num_new):
            assert seq.block_table == before and self.bm.num_free_blocks == free_before
            assert grow > free_before
            return
        assert seq.block_table[: len(before)] == before, "blocks already written must stay"
        assert len(seq.block_table) == len(before) + max(0, grow)
        assert self.bm.num_free_blocks == free_before - max(0, grow)
        seq.num_tokens += num_new

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        self.bm.free(seq)
        self.seqs.remove(seq)
        assert seq.block_table == []

    @precondition(lambda self: self.seqs)
    @rule()
    def abort_all(self):
        for seq in self.seqs:
            self.bm.free(seq)
        self.seqs.clear()
        assert self.bm.num_free_blocks == NUM_BLOCKS

    @invariant()
    def counts_match_tables(self):
        held = Counter(b for s in self.seqs for b in s.block_table)
        for block in range(NUM_BLOCKS):
            assert self.bm.ref_counts[block] == held.get(block, 0)
        free = list(self.bm._free)
        assert len(free) == len(set(free)), "a block is on the free list twice"
        assert set(free) == {b for b in range(NUM_BLOCKS) if held.get(b, 0) == 0}
        assert self.bm.num_free_blocks + self.bm.num_used_blocks == NUM_BLOCKS


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_double_free_is_caught():
    bm = BlockManager(4, 4)
    seq = Seq()
    assert bm.allocate(seq, 5)
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table
    with pytest.raises(RuntimeError, match="double free"):
        bm.free(seq)
