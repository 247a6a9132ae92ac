"""Triton varlen flash attention of packed prefill chunks over the paged KV cache
(prefill_attention).

Grid: (query tiles, num_seqs, num_kv_heads). A program's BLOCK_R rows are BLOCK_R // group
consecutive query tokens times the `group` query heads that share one KV head (token-major),
so every K/V tile is loaded once for the whole GQA group. Query i of a sequence sits at
position seq_len - q_len + i: it sees the whole cached prefix and the chunk causally. Online
softmax in the log2 domain, fp32 accumulation. An int8 cache's per-token scales are applied to
score columns and probability columns, as in decode_attention.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.decode_attention import LOG2E
from engine.kernels.launch_math import cdiv, next_power_of_2
from engine.kernels.paged_args import (
    check_paged_inputs,
    dot_dtype,
    launch_first_fitting,
    output_like,
)


@triton.jit
def _attend_kv_tile(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    k_cache_ptr,
    v_cache_ptr,
    table,
    n0,
    kv_end,
    kv_head,
    stride_cb,
    stride_co,
    stride_ch,
    qk_scale,
    k_scale_ptr,
    v_scale_ptr,
    stride_sb,
    stride_so,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_INT8: tl.constexpr,
):
    """Online-softmax update with keys n0 .. n0 + BLOCK_N. CAUSAL=False: the whole tile is
    below kv_end and visible to every row, so no key mask is built (the common case)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_pos = n0 + offs_n  # [BLOCK_N]
    if CAUSAL:
        n_mask = k_pos < kv_end
        page = tl.load(table + k_pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    else:
        page = tl.load(table + k_pos // BLOCK_SIZE).to(tl.int64)
    # [BLOCK_N, BLOCK_D] element offsets of these tokens' rows in either cache
    kv_rows = page[:, None] * stride_cb + (k_pos % BLOCK_SIZE)[:, None] * stride_co
    kv_rows += kv_head * stride_ch + offs_d[None, :]
    if CAUSAL:
        kv_mask = n_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
        k = tl.load(k_cache_ptr + kv_rows, mask=kv_mask, other=0)
        v = tl.load(v_cache_ptr + kv_rows, mask=kv_mask, other=0)
    elif HEAD_DIM == BLOCK_D:
        k = tl.load(k_cache_ptr + kv_rows)
        v = tl.load(v_cache_ptr + kv_rows)
    else:
        k = tl.load(k_cache_ptr + kv_rows, mask=(offs_d < HEAD_DIM)[None, :], other=0)
        v = tl.load(v_cache_ptr + kv_rows, mask=(offs_d < HEAD_DIM)[None, :], other=0)
    # [BLOCK_R, BLOCK_N]
    s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * qk_scale
    if KV_INT8:
        s_rows = page * stride_sb + (k_pos % BLOCK_SIZE) * stride_so + kv_head  # [BLOCK_N]
        if CAUSAL:
            k_scale = tl.load(k_scale_ptr + s_rows, mask=n_mask, other=0.0)
            v_scale = tl.load(v_scale_ptr + s_rows, mask=n_mask, other=0.0)
        else:
            k_scale = tl.load(k_scale_ptr + s_rows)
            v_scale = tl.load(v_scale_ptr + s_rows)
        s = s * k_scale.to(tl.float32)[None, :]
    if CAUSAL:  # k_pos <= q_pos, which also keeps k_pos < seq_len for real rows
        s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # Key 0 is visible to every row, so m_new is finite after the first tile; the guard
    # keeps fully masked padding rows from producing NaN anyway.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if KV_INT8:
        pv = tl.dot(
            (p * v_scale.to(tl.float32)[None, :]).to(DOT_DTYPE),
            v.to(DOT_DTYPE),
            input_precision=DOT_PRECISION,
        )
    else:
        pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    return acc * alpha[:, None] + pv, m_new, l_i


# A mixed step passes the prefill rows' metadata as views past its decodes
# (block_tables[num_decodes:], ...): their addresses' 16-byte alignment and the table's row
# stride change from step to step. They are read as scalars and gathers, never vector loads.
@triton.jit(
    do_not_specialize=["stride_bt"],
    do_not_specialize_on_alignment=["block_tables_ptr", "query_start_loc_ptr", "seq_lens_ptr"],
)
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    k_scale_ptr,
    v_scale_ptr,  # int8 caches: fp16 [num_blocks, block_size, num_kv_heads]
    qk_scale,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_cb,
    stride_co,
    stride_ch,  # k_cache and v_cache share strides
    stride_sb,
    stride_so,  # k/v scales share strides; unit head stride
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    TOKENS_PER_TILE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_INT8: tl.constexpr,
):
    # Last query tiles first: under the causal mask they have the most keys to visit.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first_tok = tile * TOKENS_PER_TILE
    if first_tok >= q_len:  # the grid covers max_query_len; shorter chunks stop early
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_R)
    tok = first_tok + rows // GROUP  # [BLOCK_R] query index within the chunk
    heads = kv_head * GROUP + rows % GROUP  # [BLOCK_R]
    r_mask = (rows < TOKENS_PER_TILE * GROUP) & (tok < q_len)
    q_pos = prefix_len + tok  # [BLOCK_R] absolute position of each row's query
    offs_d = tl.arange(0, BLOCK_D)
    qd_mask = r_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_rows = (q_start + tok).to(tl.int64) * stride_qt + heads * stride_qh  # [BLOCK_R]
    # [BLOCK_R, BLOCK_D]
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=qd_mask, other=0.0)
    q = q.to(DOT_DTYPE)

    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # Keys past this tile's last query are masked for every row: stop there. Keys up to the
    # tile's first query position are visible to every row: whole tiles of them go unmasked.
    kv_end = tl.minimum(seq_len, prefix_len + first_tok + TOKENS_PER_TILE)
    full_end = (prefix_len + first_tok + 1) // BLOCK_N * BLOCK_N
    for n0 in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(
            acc,
            m_i,
            l_i,
            q,
            q_pos,
            k_cache_ptr,
            v_cache_ptr,
            table,
            n0,
            kv_end,
            kv_head,
            stride_cb,
            stride_co,
            stride_ch,
            qk_scale,
            k_scale_ptr,
            v_scale_ptr,
            stride_sb,
            stride_so,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_SIZE,
            BLOCK_N,
            False,
            DOT_DTYPE,
            DOT_PRECISION,
            KV_INT8,
        )
    for n0 in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(
            acc,
            m_i,
            l_i,
            q,
            q_pos,
            k_cache_ptr,
            v_cache_ptr,
            table,
            n0,
            kv_end,
            kv_head,
            stride_cb,
            stride_co,
            stride_ch,
            qk_scale,
            k_scale_ptr,
            v_scale_ptr,
            stride_sb,
            stride_so,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_SIZE,
            BLOCK_N,
            True,
            DOT_DTYPE,
            DOT_PRECISION,
            KV_INT8,
        )

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    o_rows = (q_start + tok).to(tl.int64) * stride_ot + heads * stride_oh
    tl.store(
        out_ptr + o_rows[:, None] + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=qd_mask
    )


def tile_configs(block_d: int) -> tuple[int, list[dict]]:
    """(BLOCK_R query rows, launch configs best first) for a padded head_dim. H200 sweep on the
    Llama-3-8B shape: 128 keys x 8 warps x 3 stages is best at 4k tokens; the fallbacks need
    less shared memory (consumer GPUs)."""
    if block_d <= 128:
        return 128, [
            dict(BLOCK_N=128, num_warps=8, num_stages=3),
            dict(BLOCK_N=64, num_warps=4, num_stages=2),
            dict(BLOCK_N=32, num_warps=4, num_stages=1),
        ]
    return 64, [
        dict(BLOCK_N=32, num_warps=4, num_stages=2),
        dict(BLOCK_N=16, num_warps=4, num_stages=1),
    ]


def prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], sequences packed
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the chunk
    max_query_len: int,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp16
    v_scales: torch.Tensor | None = None,  # (int8 caches only)
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Chunked-prefill attention: sequence i's queries are rows query_start_loc[i] to
    query_start_loc[i+1] of q, its last q_len of seq_lens[i] tokens (all already stored in the
    cache). The offsets index q directly and need not start at 0, so a mixed batch can pass its
    whole q/out with query_start_loc[num_decodes:] (and the matching slices of block_tables and
    seq_lens); rows of out outside the given ranges are left untouched. max_query_len must be
    >= every q_len (it sizes the grid; a longer chunk would be left partly uncomputed).
    out: optional [num_tokens, num_heads, head_dim] output in q's dtype. An int8 cache comes
    with its k_scales / v_scales (engine/kernels/torch_ref.py) and is dequantized here."""
    check_paged_inputs(
        "prefill_attention", q, k_cache, v_cache, block_tables, seq_lens, k_scales, v_scales
    )
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    if (
        query_start_loc.dim() != 1
        or query_start_loc.dtype != torch.int32
        or query_start_loc.shape[0] != num_seqs + 1
        or not query_start_loc.is_contiguous()
        or query_start_loc.device != q.device
    ):
        raise ValueError(
            f"prefill_attention: query_start_loc must be contiguous int32 [{num_seqs + 1}] on "
            f"{q.device}, got {query_start_loc.dtype} {tuple(query_start_loc.shape)} on "
            f"{query_start_loc.device}"
        )
    if max_query_len < 0:
        raise ValueError(f"prefill_attention: max_query_len must be >= 0, got {max_query_len}")
    out = output_like("prefill_attention", q, out)
    if out.stride(-1) != 1:
        raise ValueError(f"prefill_attention: out needs a unit-stride last dim, {out.stride()}")
    if num_seqs == 0 or num_tokens == 0 or max_query_len == 0:
        return out

    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    block_d = max(16, next_power_of_2(head_dim))
    block_r, configs = tile_configs(block_d)
    block_r = max(block_r, next_power_of_2(group))
    tokens_per_tile = block_r // group
    grid = (cdiv(max_query_len, tokens_per_tile), num_seqs, num_kv_heads)
    is_int8 = k_scales is not None
    if not is_int8:  # placeholders, never read
        k_scales = v_scales = k_cache
    launch_first_fitting(
        _prefill_kernel,
        grid,
        configs,
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        k_scales,
        v_scales,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        *(k_scales.stride()[:2] if is_int8 else (0, 0)),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        TOKENS_PER_TILE=tokens_per_tile,
        BLOCK_R=block_r,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        DOT_DTYPE=dot_dtype(q.dtype, _prefill_kernel),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_INT8=is_int8,
    )
    return out
