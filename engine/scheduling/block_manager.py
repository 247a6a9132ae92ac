"""BlockManager: bookkeeping of the paged KV cache (free list, reference counts, block tables,
and the prefix cache).

It only answers questions and records facts: `allocate`, `free`, `cache_full_blocks`,
`match_prefix`. A failed allocation returns False and changes nothing; deciding what to preempt
is the scheduler's job. Blocks are ids into the KV pool owned by the model runner.

Blocks are reference counted: `free` drops a sequence's references, and a block goes back to
the free list when its count reaches zero.

Prefix cache: a full block is keyed by a chained 128-bit hash (the parent block's key, the
block's token ids, the engine's extra key), so a key names the whole prefix up to the block's
end and a collision is as unlikely as a 128-bit one. A cached block keeps its key when nobody
references it: it waits in the free list, most recently freed last, and a later request with
the same prefix takes it back. Allocation takes the block at the head (the least recently
used) and drops its key. Blocks that hold no cached prefix are freed to the head, so they are
reused before any cached one.

State slots: a model with linear-attention layers (Qwen3.5) also keeps a fixed-size state per
sequence (engine/memory/state_pool.py). With `slots`, a sequence takes a slot when it is admitted
(allocate_with_prefix, or take_state_slot) and gives it back in `free` (finish, abort,
preemption); such a model runs without the prefix cache, since a cached prefix would skip the
tokens its state is built from.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from engine.multimodal import images_key

if TYPE_CHECKING:
    from engine.memory.state_pool import SlotAllocator

ROOT_KEY = b""


class HasBlockTable(Protocol):
    block_table: list[int]


class CachedSeq(HasBlockTable, Protocol):
    token_ids: list[int]
    num_pending: int
    num_computed_tokens: int
    block_keys: list[bytes]
    """The keys of the first len(block_keys) blocks of block_table (cached or looked up)."""
    root_key: bytes
    """The first block's parent key (ROOT_KEY, or salted_root of a cache salt)."""
    images: list
    """The prompt's images (engine.multimodal.ImageInput): a block's key holds the hashes of
    those whose placeholders it holds."""


def salted_root(salt: str | None) -> bytes:
    """The parent key of a sequence's first block: ROOT_KEY, or one of its own per salt."""
    return ROOT_KEY if salt is None else block_key(ROOT_KEY, [], b"salt|" + salt.encode())


def block_key(parent: bytes, token_ids: list[int], extra: bytes = b"") -> bytes:
    """The key of a full block: 128 bits of BLAKE2b over the parent's key, the ids, `extra`."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    digest.update(extra)
    return digest.digest()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        caching: bool = True,
        extra_key: bytes = b"",
        slots: SlotAllocator | None = None,
    ) -> None:
        """caching: keep full blocks' keys for later requests (the prefix cache). extra_key:
        hashed into every key (what else makes equal token ids mean different KV). slots: the
        state slots of a model with linear-attention layers (then caching must be off)."""
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        if slots is not None and caching:
            raise ValueError("a model with per-sequence state slots runs without prefix caching")
        self.slots = slots
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.extra_key = extra_key
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        """Unreferenced blocks, the next to reuse first."""
        self.ref_counts = [0] * num_blocks
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references, cached ones included (reused on demand)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a cached prefix, referenced or free."""
        return len(self._key_of)

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

    def trim(self, seq: HasBlockTable, num_tokens: int) -> None:
        """Release the blocks of `seq` past those that hold its first `num_tokens` tokens (the
        slots of rejected drafted tokens)."""
        keep = self.blocks_for(num_tokens)
        for block in reversed(seq.block_table[keep:]):
            self._release(block)
        del seq.block_table[keep:]

    def free(self, seq: HasBlockTable) -> None:
        """Drop `seq`'s references; blocks nobody references go back to the free list (the
        last block first, so a prefix's later blocks are reused before its earlier ones). Its
        state slot, if it holds one, goes back too."""
        for block in reversed(seq.block_table):
            self._release(block)
        seq.block_table = []
        if hasattr(seq, "block_keys"):
            seq.block_keys = []
        slot = getattr(seq, "state_slot", None)
        if slot is not None and self.slots is not None:
            self.slots.free(slot)
            seq.state_slot = None

    def take_state_slot(self, seq) -> bool:
        """Give `seq` a state slot unless it holds one or the model keeps no state; False,
        changing nothing, when every slot is in use."""
        if self.slots is None or seq.state_slot is not None:
            return True
        slot = self.slots.take()
        if slot is None:
            return False
        seq.state_slot = slot
        return True

    # --- the prefix cache ----------------------------------------------------------------------
    def match_prefix(self, seq: CachedSeq, max_tokens: int) -> list[int]:
        """The cached blocks that hold `seq`'s longest cached prefix of at most `max_tokens`
        known tokens, in order (nothing is taken yet). Sets seq.block_keys to their keys."""
        if not self.caching:
            return []
        size, ids = self.block_size, seq.token_ids
        blocks, keys, parent = [], [], seq.root_key
        for start in range(0, max_tokens - size + 1, size):
            key = block_key(parent, ids[start : start + size], self._extra(seq, start))
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
            keys.append(key)
            parent = key
        seq.block_keys = keys
        return blocks

    def allocate_with_prefix(self, seq: HasBlockTable, cached: list[int], num_tokens: int) -> bool:
        """Start `seq`'s (empty) block table with the `cached` blocks and grow it to hold
        `num_tokens` tokens. Returns False, changing nothing, when the blocks do not fit (a
        cached block nobody references counts against the free ones)."""
        idle = sum(1 for b in cached if self.ref_counts[b] == 0)
        grow = self.blocks_for(num_tokens) - len(cached)
        if max(grow, 0) > len(self._free) - idle or not self.take_state_slot(seq):
            return False
        for block in cached:
            if self.ref_counts[block] == 0:
                del self._free[block]
            self.ref_counts[block] += 1
        seq.block_table = list(cached)
        if grow > 0:
            seq.block_table.extend(self._take() for _ in range(grow))
        return True

    def cache_full_blocks(self, seq: CachedSeq, num_computed: int | None = None) -> None:
        """Key every block of `seq` that is full of known tokens computed by the step being
        scheduled (its first `num_computed`; default seq.num_computed_tokens) and has no key
        yet. A block whose key another block already holds stays uncached (same prefix twice)."""
        if not self.caching:
            return
        size = self.block_size
        computed = seq.num_computed_tokens if num_computed is None else num_computed
        known = min(computed, len(seq.token_ids) - seq.num_pending)
        keys = seq.block_keys
        while (len(keys) + 1) * size <= known and len(keys) < len(seq.block_table):
            start = len(keys) * size
            parent = keys[-1] if keys else seq.root_key
            key = block_key(parent, seq.token_ids[start : start + size], self._extra(seq, start))
            block = seq.block_table[len(keys)]
            if key not in self._block_of and block not in self._key_of:
                self._block_of[key] = block
                self._key_of[block] = key
            keys.append(key)

    def _extra(self, seq: CachedSeq, start: int) -> bytes:
        """The key's extra bytes for `seq`'s block starting at token `start`."""
        if not seq.images:
            return self.extra_key
        return self.extra_key + images_key(seq.images, start, start + self.block_size)

    def set_caching(self, enabled: bool) -> None:
        """Turn the prefix cache on or off, dropping every key (what was cached is forgotten;
        the blocks and their references stay). Benchmarks compare both on one engine."""
        if enabled and self.slots is not None:
            raise ValueError("a model with per-sequence state slots runs without prefix caching")
        self.caching = enabled
        self._key_of.clear()
        self._block_of.clear()

    # --- internals -----------------------------------------------------------------------
    def _take(self) -> int:
        block, _ = self._free.popitem(last=False)
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._block_of[key]
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        count = self.ref_counts[block]
        if count <= 0:
            raise RuntimeError(f"double free of KV block {block}")
        self.ref_counts[block] = count - 1
        if count == 1:
            self._free[block] = None
            if block not in self._key_of:
                self._free.move_to_end(block, last=False)
