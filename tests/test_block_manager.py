"""The block manager never leaks, never double-frees and keeps reference counts right."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.scheduling.block_manager import ROOT_KEY, BlockManager, block_key

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


# --- the prefix cache --------------------------------------------------------------------------
class CachedSeq(Seq):
    def __init__(self, token_ids: list[int]) -> None:
        super().__init__()
        self.token_ids = list(token_ids)
        self.block_keys: list[bytes] = []
        self.root_key = ROOT_KEY
        self.images = []
        self.num_pending = 0
        self.num_computed_tokens = 0


def _chain_key(prefix: tuple[int, ...]) -> bytes:
    key = ROOT_KEY
    for start in range(0, len(prefix), BLOCK_SIZE):
        key = block_key(key, list(prefix[start : start + BLOCK_SIZE]))
    return key


TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=14)  # few ids: prefixes repeat


class PrefixCacheMachine(RuleBasedStateMachine):
    """Sequences whose token ids repeat, admitted with their cached prefix, grown, freed."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
        self.seqs: list[CachedSeq] = []
        self.written: dict[int, tuple[int, ...]] = {}
        """Block -> the whole prefix its KV was computed for (up to the block's end)."""
        self.freed_at: dict[int, int] = {}
        self.clock = 0

    def _compute(self, seq: CachedSeq, start: int) -> None:
        """The model computes seq's tokens from `start` into its blocks."""
        for i in range(start // BLOCK_SIZE, len(seq.block_table)):
            end = min((i + 1) * BLOCK_SIZE, len(seq.token_ids))
            self.written[seq.block_table[i]] = tuple(seq.token_ids[:end])
        seq.num_computed_tokens = len(seq.token_ids)
        self.bm.cache_full_blocks(seq)

    @rule(tokens=TOKENS)
    def admit(self, tokens):
        seq = CachedSeq(tokens)
        free_before = self.bm.num_free_blocks
        cached = self.bm.match_prefix(seq, len(tokens) - 1)
        for i, block in enumerate(cached):  # a hit holds exactly this prefix
            assert self.written[block] == tuple(tokens[: (i + 1) * BLOCK_SIZE])
        assert len(cached) * BLOCK_SIZE <= len(tokens) - 1
        if not self.bm.allocate_with_prefix(seq, cached, len(tokens)):
            assert seq.block_table == [] and self.bm.num_free_blocks == free_before
            return
        assert seq.block_table[: len(cached)] == cached
        self._compute(seq, len(cached) * BLOCK_SIZE)
        self.seqs.append(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), more=TOKENS)
    def append(self, data, more):
        seq = data.draw(st.sampled_from(self.seqs))
        start = len(seq.token_ids)
        if not self.bm.allocate(seq, start + len(more)):
            return
        seq.token_ids += more
        self._compute(seq, start)

    def _free(self, seq: CachedSeq) -> None:
        table = list(seq.block_table)
        self.bm.free(seq)
        self.seqs.remove(seq)
        for block in reversed(table):  # the order free() releases them in
            if self.bm.ref_counts[block] == 0:
                self.clock += 1
                self.freed_at[block] = self.clock

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        self._free(data.draw(st.sampled_from(self.seqs)))

    @rule()
    def free_all(self):
        while self.seqs:
            self._free(self.seqs[-1])
        assert self.bm.num_free_blocks == NUM_BLOCKS  # nothing leaks

    @invariant()
    def no_block_is_both_free_and_referenced(self):
        held = Counter(b for s in self.seqs for b in s.block_table)
        assert all(self.bm.ref_counts[b] == held.get(b, 0) for b in range(NUM_BLOCKS))
        assert set(self.bm._free) == {b for b in range(NUM_BLOCKS) if held.get(b, 0) == 0}

    @invariant()
    def every_key_names_the_tokens_its_block_holds(self):
        for key, block in self.bm._block_of.items():
            assert self.bm._key_of[block] == key
            assert _chain_key(self.written[block]) == key
            assert len(self.written[block]) % BLOCK_SIZE == 0
        assert len(self.bm._key_of) == len(self.bm._block_of)

    @invariant()
    def eviction_follows_lru(self):
        """Free blocks are reused head first: uncached ones, then cached ones least recently
        freed first."""
        order = list(self.bm._free)
        cached = [b for b in order if b in self.bm._key_of]
        assert order[len(order) - len(cached) :] == cached, "an uncached block after a cached"
        times = [self.freed_at.get(b, 0) for b in cached]
        assert times == sorted(times)


TestPrefixCache = PrefixCacheMachine.TestCase
TestPrefixCache.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def _admit(bm: BlockManager, tokens: list[int]) -> CachedSeq:
    seq = CachedSeq(tokens)
    cached = bm.match_prefix(seq, len(tokens) - 1)
    assert bm.allocate_with_prefix(seq, cached, len(tokens))
    seq.num_computed_tokens = len(tokens)
    bm.cache_full_blocks(seq)
    return seq


def test_a_freed_prefix_is_hit_then_evicted_least_recently_used_first():
    bm = BlockManager(4, 4)
    a = _admit(bm, [1, 1, 1, 1, 9])  # block 0 keyed, block 1 partial
    bm.free(a)
    b = _admit(bm, [1, 1, 1, 1, 8])
    assert b.block_table[0] == 0 and bm.ref_counts[0] == 1  # the hit: a's block
    c = _admit(bm, [2, 2, 2, 2, 7])
    bm.free(c)  # c's full block is cached and the most recently freed
    bm.free(b)
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 4
    d = _admit(bm, [3] * 9)  # three blocks: the two uncached, then c's (freed before b's)
    assert bm.match_prefix(CachedSeq([2, 2, 2, 2, 0]), 4) == []  # c's key dropped
    assert bm.match_prefix(CachedSeq([1, 1, 1, 1, 0]), 4) == [0]  # b's kept
    e = _admit(bm, [4] * 3)  # the last free block: b's cached one
    assert bm.match_prefix(CachedSeq([1, 1, 1, 1, 0]), 4) == []
    bm.free(d)
    bm.free(e)
    assert bm.num_free_blocks == 4


def test_caching_off_keys_nothing():
    bm = BlockManager(4, 4, caching=False)
    bm.free(_admit(bm, [1, 1, 1, 1, 9]))
    assert bm.num_cached_blocks == 0 and bm.match_prefix(CachedSeq([1, 1, 1, 1, 9]), 4) == []


def test_turning_caching_off_forgets_every_key_and_on_starts_empty():
    bm = BlockManager(4, 4)
    bm.free(_admit(bm, [1, 1, 1, 1, 9]))
    held = _admit(bm, [5, 5, 5, 5, 5])
    assert bm.num_cached_blocks == 2
    bm.set_caching(False)
    assert bm.num_cached_blocks == 0 and bm.match_prefix(CachedSeq([1, 1, 1, 1, 9]), 4) == []
    assert bm.num_free_blocks == 2 and bm.ref_counts[held.block_table[0]] == 1  # kept
    bm.set_caching(True)
    assert bm.match_prefix(CachedSeq([1, 1, 1, 1, 9]), 4) == []
    bm.free(_admit(bm, [1, 1, 1, 1, 9]))
    assert bm.match_prefix(CachedSeq([1, 1, 1, 1, 9]), 4) != []
    bm.free(held)
    assert bm.num_free_blocks == 4
