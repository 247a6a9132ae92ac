"""Pure-PyTorch paged-KV attention: the CPU path and the reference every Triton kernel is
tested against.

KV-cache layout (decided once, shared by every kernel): per layer, two tensors
`k_cache` and `v_cache`, each [num_blocks, block_size, num_kv_heads, head_dim], contiguous.
Token t of a sequence lives in block `block_table[t // block_size]` at offset
`t % block_size`; its flat slot is `block * block_size + offset`. All layers live in one big
tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] whose views these are.
New K/V are written into the cache first, then attention reads everything from the cache.

Attention variants (per layer, keyword arguments of both attention functions):
- `window` W: a query at position p sees keys at positions p - W + 1 .. p (W keys, itself
  included), as transformers' sliding-window layers do; None: every earlier key.
- `softcap` c: logits (after the scale) become c * tanh(logits / c) before the softmax.
- `sinks` [num_heads]: a learned logit per head joins each softmax's denominator and takes
  part of the weight (gpt-oss): p_j = exp(l_j) / (sum_i exp(l_i) + exp(sink)).

INT8 KV cache (kv_cache_dtype="int8"): the caches hold int8 and two more views,
`k_scales` / `v_scales` [num_blocks, block_size, num_kv_heads] fp16 (from one tensor
[num_layers, 2, num_blocks, block_size, num_kv_heads]), hold one scale per token and KV head.
Symmetric absmax: scale = fp16(max|x| / 127), q = round_half_away(x / scale) clamped to
[-127, 127], x ~= q * scale. fp16 scales cost 2 bytes per 128-byte row (vs 4 for fp32), and
their relative rounding error (2^-11) is far below the int8 step; an all-zero row gets scale 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KV_SCALE_DTYPE = torch.float16
_FP16_MAX = 65504.0


def quantize_kv_ref(
    x: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
) -> tuple[torch.Tensor, torch.Tensor]:  # int8 [num_tokens, num_kv_heads, head_dim], fp16 scales
    """Symmetric per-(token, head) absmax int8 quantization (the store_kv kernel's formula)."""
    xf = x.float()
    absmax = xf.abs().amax(-1)  # [num_tokens, num_kv_heads]
    scale = (absmax / 127.0).clamp(max=_FP16_MAX).to(KV_SCALE_DTYPE)
    s32 = scale.float()
    inv = torch.where(s32 > 0, 1.0 / torch.where(s32 > 0, s32, 1.0), 0.0)
    y = xf * inv[..., None]
    q = torch.where(y >= 0, torch.floor(y + 0.5), torch.ceil(y - 0.5)).clamp(-127, 127)
    return q.to(torch.int8), scale


def dequantize_kv_ref(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] int8 and [...] scales -> fp32 values."""
    return q.float() * scales.float()[..., None]


def store_kv_ref(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] (int8 cache)
    v_scales: torch.Tensor | None = None,
) -> None:
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if k_cache.dtype == torch.int8:
        k, k_s = quantize_kv_ref(k)
        v, v_s = quantize_kv_ref(v)
        k_scales.view(-1, num_kv_heads).index_copy_(0, slot_mapping, k_s.to(k_scales.dtype))
        v_scales.view(-1, num_kv_heads).index_copy_(0, slot_mapping, v_s.to(v_scales.dtype))
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


def _values(cache: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype, gather, *args):
    """gather(cache, *args) in `dtype`, dequantized with the same gather of `scales` if int8."""
    if cache.dtype != torch.int8:
        return gather(cache, *args).to(dtype)
    return dequantize_kv_ref(gather(cache, *args), gather(scales, *args)).to(dtype)


def decode_attention_ref(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] (int8 cache)
    v_scales: torch.Tensor | None = None,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query token per sequence, attending to all `seq_lens[i]` cached tokens."""
    num_seqs, num_heads, head_dim = q.shape
    if num_seqs == 0:
        return q.new_empty(q.shape)
    if window is not None or softcap is not None or sinks is not None:
        starts = list(range(num_seqs + 1))
        variant = {"window": window, "softcap": softcap, "sinks": sinks}
        lens = [int(n) for n in seq_lens.tolist()]
        scales = (k_scales, v_scales)
        return prefill_attention_ref(
            q, k_cache, v_cache, block_tables, starts, lens, scale, *scales, **variant
        )
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    tables = block_tables[:, :num_blocks]
    shape = (num_seqs, num_blocks * block_size, num_kv_heads, head_dim)
    # [num_seqs, num_kv_heads, max_len, head_dim]
    k = _values(k_cache, k_scales, q.dtype, _gather_blocks, tables)
    v = _values(v_cache, v_scales, q.dtype, _gather_blocks, tables)
    k = k.reshape(shape)[:, :max_len].transpose(1, 2)
    v = v.reshape(shape)[:, :max_len].transpose(1, 2)
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
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] (int8 cache)
    v_scales: torch.Tensor | None = None,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Chunked prefill: each sequence's queries are its last q_len tokens of seq_len; causal
    within the chunk, full over the cached prefix (within `window` when given)."""
    variant = window is not None or softcap is not None or sinks is not None
    out = torch.empty_like(q)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        q_len = end - start
        # [1, heads, len, head_dim]; enable_gqa maps query head h to KV head h // group
        qs = q[start:end].transpose(0, 1).unsqueeze(0)
        ks = _values(k_cache, k_scales, q.dtype, _gather, block_tables[i], seq_len)
        vs = _values(v_cache, v_scales, q.dtype, _gather, block_tables[i], seq_len)
        if variant:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
            out[start:end] = _attend_variant(
                q[start:end], ks, vs, q_pos, scale, window, softcap, sinks
            )
            continue
        ks, vs = ks.transpose(0, 1).unsqueeze(0), vs.transpose(0, 1).unsqueeze(0)
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


def image_attention_ref(
    q: torch.Tensor,  # [q_len, num_heads, head_dim]: the queries of one image's placeholders
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,  # [max_blocks] int32: the sequence's blocks
    first_position: int,
    key_end: int,
    scale: float,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # [q_len, num_heads, head_dim]
    """Queries at positions first_position.. of an image whose placeholders end at `key_end`
    (their K/V cached): each sees every key before key_end (the whole image both ways, and all
    before it), within `window`."""
    ks = _values(k_cache, k_scales, q.dtype, _gather, block_table, key_end)
    vs = _values(v_cache, v_scales, q.dtype, _gather, block_table, key_end)
    q_pos = torch.arange(first_position, first_position + q.shape[0], device=q.device)
    return _attend_variant(q, ks, vs, q_pos, scale, window, softcap, sinks, key_end)


def _attend_variant(
    q: torch.Tensor,  # [q_len, num_heads, head_dim]
    k: torch.Tensor,  # [seq_len, num_kv_heads, head_dim]
    v: torch.Tensor,
    q_pos: torch.Tensor,  # [q_len]: each query's position
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
    key_end: int | None = None,
) -> torch.Tensor:  # [q_len, num_heads, head_dim]
    """Attention with a window, a soft-cap and sinks, spelled out in fp32. `key_end`: every
    key before it is seen (within the window), not only the causal ones."""
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, seq_len, dim]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    logits = (q.float().transpose(0, 1) @ kf.transpose(1, 2)) * scale  # [heads, q_len, seq_len]
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    k_pos = torch.arange(k.shape[0], device=q.device)
    mask = k_pos[None, :] <= q_pos[:, None]
    if key_end is not None:
        mask |= k_pos[None, :] < key_end
    if window is not None:
        mask &= k_pos[None, :] > q_pos[:, None] - window
    logits = logits.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.float()[:, None, None].expand(-1, logits.shape[1], 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    return (probs @ vf).transpose(0, 1).to(q.dtype)
