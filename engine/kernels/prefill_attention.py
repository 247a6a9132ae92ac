"""Triton varlen flash attention of packed prefill chunks over the paged KV cache
(prefill_attention).

Grid: (query tiles, num_seqs, num_kv_heads). A program's BLOCK_R rows are BLOCK_R // group
consecutive query tokens times the `group` query heads that share one KV head (token-major),
so every K/V tile is loaded once for the whole GQA group. Query i of a sequence sits at
position seq_len - q_len + i: it sees the whole cached prefix and the chunk causally. Online
softmax in the log2 domain, fp32 accumulation. An int8 cache's per-token scales are applied to
score columns and probability columns, as in decode_attention. The key loop and the tiles it
visits (a window's only, for a sliding layer) are in engine/kernels/prefill_tiles.py; soft-cap
and sinks in engine/kernels/attention_variants.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.attention_variants import LOG2E, normalise, variant_args
from engine.kernels.launch_math import cdiv, next_power_of_2
from engine.kernels.paged_args import (
    check_paged_inputs,
    dot_dtype,
    launch_first_fitting,
    output_like,
)
from engine.kernels.prefill_tiles import attend_keys


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
    sinks_ptr,  # SINKS: [num_heads]
    qk_scale,  # softmax scale * log2(e)
    window,  # WINDOW: a query at p sees keys p - window + 1 .. p
    softcap,  # SOFTCAP: softcap * log2(e)
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
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
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
    first_q = prefix_len + first_tok  # the tile's first query position
    kv_end = tl.minimum(seq_len, first_q + TOKENS_PER_TILE)  # keys past its last query: none
    acc, m_i, l_i = attend_keys(
        acc,
        m_i,
        l_i,
        q,
        q_pos,
        k_cache_ptr,
        v_cache_ptr,
        table,
        first_q,
        kv_end,
        kv_head,
        stride_cb,
        stride_co,
        stride_ch,
        qk_scale,
        window,
        softcap,
        k_scale_ptr,
        v_scale_ptr,
        stride_sb,
        stride_so,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_SIZE,
        BLOCK_N,
        DOT_DTYPE,
        DOT_PRECISION,
        KV_INT8,
        WINDOW,
        SOFTCAP,
    )
    o = normalise(acc, m_i, l_i, sinks_ptr, heads, r_mask, SINKS)
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
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Chunked-prefill attention: sequence i's queries are rows query_start_loc[i] to
    query_start_loc[i+1] of q, its last q_len of seq_lens[i] tokens (all already stored in the
    cache). The offsets index q directly and need not start at 0, so a mixed batch can pass its
    whole q/out with query_start_loc[num_decodes:] (and the matching slices of block_tables and
    seq_lens); rows of out outside the given ranges are left untouched. max_query_len must be
    >= every q_len (it sizes the grid; a longer chunk would be left partly uncomputed).
    out: optional [num_tokens, num_heads, head_dim] output in q's dtype. An int8 cache comes
    with its k_scales / v_scales (engine/kernels/torch_ref.py) and is dequantized here.
    window, softcap, sinks: the layer's variant, as engine/kernels/torch_ref.py defines it."""
    check_paged_inputs(
        "prefill_attention", q, k_cache, v_cache, block_tables, seq_lens, k_scales, v_scales
    )
    variant, flags = variant_args("prefill_attention", q, k_cache, window, softcap, sinks)
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
        variant[2],
        scale * LOG2E,
        *variant[:2],
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
        **flags,
    )
    return out
