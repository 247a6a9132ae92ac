"""Pure-PyTorch paged-KV attention: the CPU path and the reference every Triton kernel is
tested against.

KV-cache layout (decided once, shared by every kernel): per layer, two tensors
`k_cache` and `v_cache`, each [num_blocks, block_size, num_kv_heads, head_dim], contiguous.
Token t of a sequence lives in block `block_table[t // block_size]` at offset
`t % block_size`; its flat slot is `block * block_size + offset`. All layers live in one big
tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] whose views these are.
New K/V are written into the cache first, then attention reads everything from the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv_ref(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    # [len(block_ids), block_size, num_kv_heads, head_dim]; index_select copies whole blocks
    # (far faster on the CPU than advanced indexing)
    flat = cache.view(cache.shape[0], -1).index_select(0, block_ids.reshape(-1).long())
    return flat.view(-1, *cache.shape[1:])


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    # [length, num_kv_heads, head_dim]: the first `length` tokens of one sequence
    num_blocks = -(-length // cache.shape[1])
    return _gather_blocks(cache, block_table[:num_blocks]).flatten(0, 1)[:length]


def decode_attention_ref(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query token per sequence, attending to all `seq_lens[i]` cached tokens."""
    num_seqs, num_heads, head_dim = q.shape
    if num_seqs == 0:
        return q.new_empty(q.shape)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    tables = block_tables[:, :num_blocks]
    shape = (num_seqs, num_blocks * block_size, num_kv_heads, head_dim)
    # [num_seqs, num_kv_heads, max_len, head_dim]
    k = _gather_blocks(k_cache, tables).view(shape)[:, :max_len].transpose(1, 2).to(q.dtype)
    v = _gather_blocks(v_cache, tables).view(shape)[:, :max_len].transpose(1, 2).to(q.dtype)
    positions = torch.arange(max_len, device=q.device)
    mask = positions[None, :] < seq_lens[:, None].to(q.device)  # [num_seqs, max_len]
    group = num_heads // num_kv_heads
    # [num_seqs, num_kv_heads, group, head_dim]
    qg = q.view(num_seqs, num_kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask[:, None, None, :], scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def prefill_attention_ref(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], packed sequences
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: list[int],  # [num_seqs + 1]
    seq_lens: list[int],  # [num_seqs]
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Chunked prefill: each sequence's queries are its last q_len tokens of seq_len; causal
    within the chunk, full over the cached prefix."""
    out = torch.empty_like(q)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        q_len = end - start
        # [1, heads, len, head_dim]; enable_gqa maps query head h to KV head h // group
        qs = q[start:end].transpose(0, 1).unsqueeze(0)
        ks = _gather(k_cache, block_tables[i], seq_len).to(q.dtype).transpose(0, 1).unsqueeze(0)
        vs = _gather(v_cache, block_tables[i], seq_len).to(q.dtype).transpose(0, 1).unsqueeze(0)
        if q_len == seq_len:
            o = F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
            k_pos = torch.arange(seq_len, device=q.device)
            mask = k_pos[None, :] <= q_pos[:, None]  # [q_len, seq_len]
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True
            )
        out[start:end] = o[0].transpose(0, 1)  # [q_len, num_heads, head_dim]
    return out
