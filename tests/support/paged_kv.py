"""Random paged-KV block tables and caches for kernel tests: the layout every attention test
starts from."""

from __future__ import annotations

import torch

from engine.kernels.torch_ref import KV_SCALE_DTYPE, quantize_kv_ref


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


def paged_caches(
    seq_lens, first_seen, num_kv_heads, head_dim, block_size, dtype, gen, device, int8=False
):
    """(k, v, k_scales, v_scales, tables) on `device`: live tokens N(0, 1) (int8-quantized with
    int8), NaN before token first_seen[i] of sequence i and in every dead slot (an int8
    cache: NaN scales)."""
    num_blocks, tables, slots = paged_tables(seq_lens, block_size, gen, spare=2)
    positions = [t for n in seq_lens for t in range(n)]
    hidden = [t < first_seen[i] for i, n in enumerate(seq_lens) for t in range(n)]
    slots = torch.tensor(slots, dtype=torch.long)
    hidden = torch.tensor(hidden, dtype=torch.bool).reshape(len(positions))
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    out = []
    for _ in range(2):
        live = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen)
        if int8:
            cache = torch.randint(-128, 128, shape, generator=gen).to(torch.int8)
            scales = torch.full(shape[:3], float("nan"), dtype=KV_SCALE_DTYPE)
            values, s = quantize_kv_ref(live)
            s[hidden] = float("nan")
            cache.view(-1, num_kv_heads, head_dim)[slots] = values
            scales.view(-1, num_kv_heads)[slots] = s
            out.append((cache.to(device), scales.to(device)))
        else:
            cache = torch.full(shape, float("nan"), dtype=dtype)
            live[hidden] = float("nan")
            cache.view(-1, num_kv_heads, head_dim)[slots] = live.to(dtype)
            out.append((cache.to(device), None))
    (k, ks), (v, vs) = out
    return k, v, ks, vs, tables.to(device)


def reference_caches(k, v, ks, vs):
    """fp32 caches for the reference, hidden and dead slots 0 (it masks them)."""
    if ks is None:
        return k.nan_to_num(0.0).float(), v.nan_to_num(0.0).float()
    deq = [(c.float() * s.float()[..., None]).nan_to_num(0.0) for c, s in ((k, ks), (v, vs))]
    return deq[0], deq[1]
