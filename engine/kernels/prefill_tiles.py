"""The key loop of the prefill attention kernel (engine/kernels/prefill_attention.py): which
key tiles a tile of query rows visits, and the online-softmax update with one key tile.

A query tile holds the queries at positions first_q .. last_q of one sequence (last_q =
kv_end - 1). Without a window it visits keys 0 .. kv_end: whole BLOCK_N tiles up to first_q
unmasked (every row sees them), the rest causally masked. With a window W it starts at the
first row's first key, first_q - W + 1, so a long context reads only the window: masked tiles
until keys every row's window holds (from last_q - W + 1), then unmasked ones up to first_q,
then masked ones. Key tiles start anywhere (each key's block is looked up on its own).
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.kernels.attention_variants import soft_cap


@triton.jit
def attend_kv_tile(
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
    window,
    softcap,
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
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Online-softmax update with keys n0 .. n0 + BLOCK_N. CAUSAL=False: the whole tile is
    below kv_end and visible to every row, so no key mask is built (the common case).
    CAUSAL=True masks keys past each row's query and, with WINDOW, keys before its window."""
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
    if SOFTCAP:
        s = soft_cap(s, softcap)
    if CAUSAL:  # k_pos <= q_pos, which also keeps k_pos < seq_len for real rows
        visible = k_pos[None, :] <= q_pos[:, None]
        if WINDOW:
            visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # Without a window key 0 is visible to every row, so m_new is finite after the first
    # tile; the guard keeps rows that saw no key yet (padding rows, or rows whose window
    # starts past this tile) from producing NaN.
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


@triton.jit
def attend_keys(
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
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_INT8: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """(acc, m_i, l_i) after every key the tile's rows (queries first_q .. kv_end - 1) see."""
    if WINDOW:
        lo = tl.maximum(first_q - window + 1, 0)  # no row sees a key before
        every = tl.maximum(kv_end - window, lo)  # every row's window holds keys from here
        mid = lo + (every - lo + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        full_end = mid + tl.maximum(first_q + 1 - mid, 0) // BLOCK_N * BLOCK_N
        for n0 in range(lo, mid, BLOCK_N):
            acc, m_i, l_i = attend_kv_tile(
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
                True,
                DOT_DTYPE,
                DOT_PRECISION,
                KV_INT8,
                WINDOW,
                SOFTCAP,
            )
    else:
        # Keys up to the tile's first query position are visible to every row: whole tiles
        # of them go unmasked.
        mid = 0
        full_end = (first_q + 1) // BLOCK_N * BLOCK_N
    for n0 in range(mid, full_end, BLOCK_N):
        acc, m_i, l_i = attend_kv_tile(
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
            False,
            DOT_DTYPE,
            DOT_PRECISION,
            KV_INT8,
            WINDOW,
            SOFTCAP,
        )
    # Keys past this tile's last query are masked for every row: kv_end stops there.
    for n0 in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = attend_kv_tile(
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
            True,
            DOT_DTYPE,
            DOT_PRECISION,
            KV_INT8,
            WINDOW,
            SOFTCAP,
        )
    return acc, m_i, l_i
