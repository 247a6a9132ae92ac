"""Sorting a MoE step's (token, slot) pairs by expert for the grouped GEMMs of kernels/moe.py,
in Triton and without a host synchronisation (CUDA-graph safe).

The num_tokens * k pairs are numbered by their flat index s = token * k + slot. Each expert's
pairs fill whole tiles of BLOCK_M rows: expert e's rows start at the sum of the
earlier experts' padded counts (ceil(count / BLOCK_M) * BLOCK_M); rows past its count hold the
sentinel num_tokens * k. An expert with no pair has no row and no tile. Every tile records its
expert, and -1 past the used rows, where the GEMM programs exit at once. Buffers are sized by
the worst case, so their shapes depend only on (num_tokens, k, num_experts, BLOCK_M).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.launch_math import cdiv, next_power_of_2

ALIGN_ELEMENTS = 8192
"""Elements of the [chunk, experts] one-hot matrix the one-program sort handles a step (its
chunk of pairs is this over the padded expert count, at least 16)."""
ONE_PROGRAM_PAIRS = 1024
"""Up to this many pairs (decode batches: 128 tokens of top-8) one program sorts them, in one
launch and in flat order within each expert; more (prefill) are counted and placed by one
program per SCATTER_CHUNK pairs with atomic counters, each expert's pairs then in any order
(each row's result does not depend on its place in the tile)."""
SCATTER_CHUNK = 1024


def max_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The most sorted rows: every pair, plus at most BLOCK_M - 1 padding rows for each expert
    that has a pair (at most min(num_experts, num_pairs) of them)."""
    return num_pairs + min(num_experts, num_pairs) * (block_m - 1)


@triton.jit
def _expert_rows(counts, BLOCK_M: tl.constexpr):
    """Pairs per expert [BLOCK_E] -> (each expert's first row, first row past its tiles, rows
    used by all)."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # [BLOCK_E]
    ends = tl.cumsum(padded, axis=0)
    return ends - padded, ends, tl.sum(padded, axis=0)


@triton.jit
def _store_tile_experts(
    tile_expert_ptr, ends, used_rows, num_tiles, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr
):
    """Each tile's expert (the count of experts whose rows end at or before the tile's first
    row), -1 past the used rows."""
    for t0 in range(0, num_tiles, CHUNK):
        tiles = t0 + tl.arange(0, CHUNK)
        first = tiles * BLOCK_M  # [CHUNK]
        owner = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)
        owner = tl.where(first < used_rows, owner, -1)
        tl.store(tile_expert_ptr + tiles, owner, mask=tiles < num_tiles)


@triton.jit(do_not_specialize=["num_pairs", "num_tiles", "num_rows"])
def _align_kernel(
    ids_ptr,  # [num_pairs] expert of each pair
    sorted_ptr,  # [num_rows] int32: the pair each sorted row holds, num_pairs for padding
    tile_expert_ptr,  # [num_tiles] int32: each tile's expert, -1 past the used rows
    num_pairs,
    num_tiles,
    num_rows,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CHUNK: tl.constexpr,
):
    # One program: every pair, in flat order within each expert.
    experts = tl.arange(0, BLOCK_E)
    # Pass 1: pairs per expert.
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1).to(tl.int32)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)  # [CHUNK, BLOCK_E]
        counts += tl.sum(onehot, axis=0)
    starts, ends, used_rows = _expert_rows(counts, BLOCK_M)
    _store_tile_experts(tile_expert_ptr, ends, used_rows, num_tiles, BLOCK_M, CHUNK)
    # Pass 2: every row gets the sentinel, then each pair goes to its expert's next row.
    for r0 in range(0, num_rows, CHUNK):
        rows = r0 + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + rows, tl.zeros([CHUNK], dtype=tl.int32) + num_pairs, rows < num_rows)
    tl.debug_barrier()  # the sentinels land before the pairs overwrite some of them
    seen = tl.zeros([BLOCK_E], dtype=tl.int32)  # pairs of each expert in earlier chunks
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1).to(tl.int32)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)  # [CHUNK, BLOCK_E]
        earlier = tl.cumsum(onehot, axis=0) - onehot  # same-expert pairs before, in the chunk
        row = tl.sum(onehot * (earlier + (starts + seen)[None, :]), axis=1)  # [CHUNK]
        tl.store(sorted_ptr + row, offs, mask=offs < num_pairs)
        seen += tl.sum(onehot, axis=0)


@triton.jit(do_not_specialize=["num_pairs"])
def _count_kernel(ids_ptr, counts_ptr, num_pairs, CHUNK: tl.constexpr):
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < num_pairs
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    tl.atomic_add(counts_ptr + ids, tl.full([CHUNK], 1, tl.int32), mask=mask)


@triton.jit(do_not_specialize=["num_tiles"])
def _layout_kernel(
    counts_ptr,  # [BLOCK_E] int32 pairs per expert, in: the next free row of each expert
    tile_expert_ptr,
    num_tiles,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CHUNK: tl.constexpr,
):
    starts, ends, used_rows = _expert_rows(tl.load(counts_ptr + tl.arange(0, BLOCK_E)), BLOCK_M)
    _store_tile_experts(tile_expert_ptr, ends, used_rows, num_tiles, BLOCK_M, CHUNK)
    tl.store(counts_ptr + tl.arange(0, BLOCK_E), starts)


@triton.jit(do_not_specialize=["num_pairs"])
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, num_pairs, CHUNK: tl.constexpr):
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < num_pairs
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    row = tl.atomic_add(cursor_ptr + ids, tl.full([CHUNK], 1, tl.int32), mask=mask)
    tl.store(sorted_ptr + row, offs, mask=mask)


def align_by_expert(
    topk_ids: torch.Tensor,  # [num_tokens, k] int32 / int64, each in [0, num_experts)
    num_experts: int,
    block_m: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted pair per row [max_rows] int32, expert per tile [cdiv(max_rows, block_m)] int32)
    as the module docstring lays them out."""
    flat = topk_ids.reshape(-1)
    num_pairs = flat.numel()
    num_rows = max_rows(num_pairs, num_experts, block_m)
    num_tiles = cdiv(num_rows, block_m)
    tile_expert = torch.empty(num_tiles, dtype=torch.int32, device=flat.device)
    block_e = next_power_of_2(num_experts)
    chunk = max(16, ALIGN_ELEMENTS // block_e)
    if num_pairs <= ONE_PROGRAM_PAIRS:
        sorted_pairs = torch.empty(num_rows, dtype=torch.int32, device=flat.device)
        _align_kernel[(1,)](
            flat,
            sorted_pairs,
            tile_expert,
            num_pairs,
            num_tiles,
            num_rows,
            BLOCK_M=block_m,
            BLOCK_E=block_e,
            CHUNK=chunk,
            num_warps=8,
        )
        return sorted_pairs, tile_expert
    sorted_pairs = torch.full((num_rows,), num_pairs, dtype=torch.int32, device=flat.device)
    counts = torch.zeros(block_e, dtype=torch.int32, device=flat.device)  # then the cursors
    grid = (cdiv(num_pairs, SCATTER_CHUNK),)
    _count_kernel[grid](flat, counts, num_pairs, CHUNK=SCATTER_CHUNK)
    _layout_kernel[(1,)](
        counts, tile_expert, num_tiles, BLOCK_M=block_m, BLOCK_E=block_e, CHUNK=chunk, num_warps=8
    )
    _scatter_kernel[grid](flat, counts, sorted_pairs, num_pairs, CHUNK=SCATTER_CHUNK)
    return sorted_pairs, tile_expert
