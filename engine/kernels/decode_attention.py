"""Triton split-K (flash-decoding) paged attention for single-token decodes (decode_attention).

Grid of the main kernel: (num_seqs, num_kv_heads, num_splits). Each program takes every query
head that shares one KV head (GQA group, padded to 16 rows for tl.dot) and one contiguous range
of the sequence's tokens, so each KV block is read once per group. It writes a partial
(acc, max, sum) per query head into an fp32 workspace; a second kernel merges the splits. With
num_splits == 1 the main kernel normalises and writes the output itself (one launch).
Variants (engine/kernels/attention_variants.py): with a window the splits share out only the
window's keys; soft-cap applies to each score; a sink joins the denominator once, where the
output is normalised (the single split's kernel, or the merge).

INT8 KV cache: K/V tiles are int8 (exact in any dot dtype) and each token's fp16 scale is
applied outside the matmuls: scores are scaled per key column, probabilities per value row
(p * v_scale) before the PV matmul, so no tile is dequantized element by element.

Workspace: fp32 [max_num_seqs, num_heads, num_splits, head_dim + 2]; [..., :head_dim] holds
the unnormalised accumulator, [..., head_dim] the running max (log2 domain), [..., head_dim+1]
the running sum. Every program writes its whole slice, so the buffer needs no zeroing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import pdl
from engine.kernels.attention_variants import (
    LOG2E,
    normalise,
    sink_logits,
    soft_cap,
    variant_args,
)
from engine.kernels.launch_math import cdiv, next_power_of_2
from engine.kernels.paged_args import (
    check_paged_inputs,
    check_workspace,
    dot_dtype,
    launch_first_fitting,
    output_like,
)

MIN_TOKENS_PER_SPLIT = 64  # one BLOCK_N tile: at batch 1 more splits keep winning
MAX_SPLITS = 64
WS_STRIDES = ("stride_ws_s", "stride_ws_h", "stride_ws_p")
"""The split-K workspace's strides, which follow the split count."""


def default_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device
) -> int:
    """Splits per sequence: enough programs for ~2 per SM, but >= MIN_TOKENS_PER_SPLIT
    tokens each (long contexts at small batch split most)."""
    num_sms = 132
    if device.type == "cuda":
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    by_work = cdiv(max(max_seq_len, 1), MIN_TOKENS_PER_SPLIT)
    by_occupancy = cdiv(2 * num_sms, max(num_seqs * num_kv_heads, 1))
    return max(1, min(by_work, by_occupancy, MAX_SPLITS))


# Step-varying ints: the split count (eager decodes pick it from the batch), the workspace
# strides that follow it, and the block table's row stride (the batch's longest table). None
# addresses a vector access that could use the hint: a workspace row is head_dim + 2 floats.
@triton.jit(do_not_specialize=["num_splits", "stride_bt", *WS_STRIDES])
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    ws_ptr,
    out_ptr,
    k_scale_ptr,
    v_scale_ptr,  # int8 caches: fp16 [num_blocks, block_size, num_kv_heads]
    sinks_ptr,  # SINKS: [num_heads]
    qk_scale,  # softmax scale * log2(e)
    window,  # WINDOW: keys seq_len - window .. seq_len - 1
    softcap,  # SOFTCAP: softcap * log2(e)
    num_splits,
    stride_qs,
    stride_qh,
    stride_cb,
    stride_co,
    stride_ch,  # k_cache and v_cache share strides
    stride_sb,
    stride_so,  # k/v scales share strides; unit head stride
    stride_bt,
    stride_ws_s,
    stride_ws_h,
    stride_ws_p,
    stride_os,
    stride_oh,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_INT8: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)  # engine/kernels/pdl.py
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # The keys the query sees: all, or the window's (the splits share those out, so a long
    # context reads only its window).
    first = 0
    if WINDOW:
        first = tl.maximum(seq_len - window, 0)
    # This split's token range, whole BLOCK_N tiles; trailing splits of short sequences are
    # empty and write (acc=0, max=-inf, sum=0), which the merge ignores.
    tokens_per_split = ((seq_len - first + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N
    tokens_per_split *= BLOCK_N
    start = first + split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + offs_g  # [BLOCK_G]
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    qd_mask = g_mask[:, None] & d_mask[None, :]
    # [BLOCK_G, BLOCK_D]
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
        mask=qd_mask,
        other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        toks = n0 + offs_n  # [BLOCK_N]
        n_mask = toks < end
        page = tl.load(table + toks // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        offset = toks % BLOCK_SIZE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        # [BLOCK_N, BLOCK_D] element offsets of these tokens' rows in either cache
        kv_rows = page[:, None] * stride_cb + offset[:, None] * stride_co + kv_head * stride_ch
        k = tl.load(k_cache_ptr + kv_rows + offs_d[None, :], mask=kv_mask, other=0)
        v = tl.load(v_cache_ptr + kv_rows + offs_d[None, :], mask=kv_mask, other=0)
        # [BLOCK_G, BLOCK_N]
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * qk_scale
        if KV_INT8:
            s_rows = page * stride_sb + offset * stride_so + kv_head  # [BLOCK_N]
            k_scale = tl.load(k_scale_ptr + s_rows, mask=n_mask, other=0.0).to(tl.float32)
            v_scale = tl.load(v_scale_ptr + s_rows, mask=n_mask, other=0.0).to(tl.float32)
            s = s * k_scale[None, :]
        if SOFTCAP:
            s = soft_cap(s, softcap)
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if KV_INT8:
            pv = p * v_scale[None, :]
        else:
            pv = p
        acc = acc * alpha[:, None] + tl.dot(
            pv.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION
        )
        m_i = m_new

    if DIRECT_OUT:
        o = normalise(acc, m_i, l_i, sinks_ptr, heads, g_mask, SINKS)
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=qd_mask,
        )
    else:
        ws = ws_ptr + seq.to(tl.int64) * stride_ws_s + heads * stride_ws_h + split * stride_ws_p
        tl.store(ws[:, None] + offs_d[None, :], acc, mask=qd_mask)
        tl.store(ws + HEAD_DIM, m_i, mask=g_mask)
        tl.store(ws + HEAD_DIM + 1, l_i, mask=g_mask)


@triton.jit(do_not_specialize=["num_splits", *WS_STRIDES])
def _decode_merge_kernel(
    ws_ptr,
    out_ptr,
    sinks_ptr,  # SINKS: [num_heads]
    num_splits,
    stride_ws_s,
    stride_ws_h,
    stride_ws_p,
    stride_os,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
    SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)
    # One program per (sequence, query head): softmax-weighted merge of the split partials;
    # a head's sink logit joins the merged denominator once.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_p = tl.arange(0, BLOCK_P)
    offs_d = tl.arange(0, BLOCK_D)
    p_mask = offs_p < num_splits
    d_mask = offs_d < HEAD_DIM
    ws = ws_ptr + seq.to(tl.int64) * stride_ws_s + head * stride_ws_h + offs_p * stride_ws_p
    m = tl.load(ws + HEAD_DIM, mask=p_mask, other=float("-inf"))  # [BLOCK_P]
    l = tl.load(ws + HEAD_DIM + 1, mask=p_mask, other=0.0)  # [BLOCK_P]
    # [BLOCK_P, BLOCK_D]
    acc = tl.load(ws[:, None] + offs_d[None, :], mask=p_mask[:, None] & d_mask[None, :], other=0.0)
    m_max = tl.max(m, 0)
    if SINKS:
        sink = sink_logits(sinks_ptr, head)
        m_max = tl.maximum(m_max, sink)
    # All splits empty (seq_len 0 padding): weights 0 and output 0, not NaN.
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_max)  # [BLOCK_P]
    num = tl.sum(acc * w[:, None], 0)  # [BLOCK_D]
    den = tl.sum(l * w, 0)
    if SINKS:
        den += tl.exp2(sink - m_max)
    den = tl.where(den > 0.0, den, 1.0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + offs_d,
        (num / den).to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def merge_block(num_splits: int) -> int:
    """The merge kernel's split tile: one size for every split count up to MAX_SPLITS, so the
    split count an eager decode picks from its batch never selects a new kernel variant
    (masked rows cost no memory traffic)."""
    return next_power_of_2(max(num_splits, MAX_SPLITS))


def tile_configs(block_d: int) -> list[dict]:
    """Decode launch configs, best first (H200 sweep: BLOCK_N 64, 3 stages); later ones need
    less shared memory, for GPUs where the first does not fit."""
    if block_d <= 128:
        return [
            dict(BLOCK_N=64, num_warps=4, num_stages=3),
            dict(BLOCK_N=64, num_warps=4, num_stages=2),
            dict(BLOCK_N=32, num_warps=4, num_stages=1),
        ]
    return [
        dict(BLOCK_N=32, num_warps=4, num_stages=2),
        dict(BLOCK_N=16, num_warps=4, num_stages=1),
    ]


def decode_workspace(
    max_num_seqs: int, num_heads: int, head_dim: int, num_splits: int, device: torch.device | str
) -> torch.Tensor:
    """Allocate the fp32 split-K workspace [max_num_seqs, num_heads, num_splits, head_dim + 2]
    once (e.g. before CUDA-graph capture) and pass it to every decode_attention call."""
    return torch.empty(
        max_num_seqs, num_heads, num_splits, head_dim + 2, dtype=torch.float32, device=device
    )


def decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    *,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    workspace: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp16
    v_scales: torch.Tensor | None = None,  # (int8 caches only)
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query token per sequence attending to its first seq_lens[i] cached tokens (the
    last `window` of them with a window; softcap and sinks as engine/kernels/torch_ref.py
    defines them).

    num_splits: token-range splits per sequence; None picks one from max_seq_len (or, if that
    is None too, from seq_lens.max(), which syncs with the device). For CUDA graphs pass a
    fixed num_splits and a workspace from decode_workspace (shape[0] >= num_seqs); with
    num_splits == 1 no workspace is used. out: optional [num_seqs, num_heads, head_dim]
    output (q's dtype) to write into. Sequences with seq_len 0 produce zeros. An int8 cache
    comes with its k_scales / v_scales (engine/kernels/torch_ref.py) and is dequantized here.
    """
    check_paged_inputs(
        "decode_attention", q, k_cache, v_cache, block_tables, seq_lens, k_scales, v_scales
    )
    num_seqs, num_heads, head_dim = q.shape
    if seq_lens.shape[0] != num_seqs:
        raise ValueError(
            f"decode_attention: q has {num_seqs} sequences but seq_lens has {seq_lens.shape[0]}"
        )
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    variant, flags = variant_args("decode_attention", q, k_cache, window, softcap, sinks)
    out = output_like("decode_attention", q, out)
    if num_seqs == 0:
        return out
    if num_splits is None:
        if workspace is not None:
            num_splits = workspace.shape[2]
        else:
            if max_seq_len is None:
                max_seq_len = int(seq_lens.max())
            if window is not None:  # the keys a query reads
                max_seq_len = min(max_seq_len, window)
            num_splits = default_num_splits(num_seqs, num_kv_heads, max_seq_len, q.device)
    if out.stride(-1) != 1:
        raise ValueError(f"decode_attention: out must have a unit-stride last dim, {out.stride()}")
    if num_splits < 1:
        raise ValueError(f"decode_attention: num_splits must be >= 1, got {num_splits}")
    if num_splits > 1:
        expected = (num_heads, num_splits, head_dim + 2)
        if workspace is None:
            workspace = decode_workspace(num_seqs, num_heads, head_dim, num_splits, q.device)
        check_workspace("decode_attention", workspace, num_seqs, expected, q.device)
    # With one split the kernel writes `out` directly and never touches the workspace.
    ws = workspace if num_splits > 1 else out
    ws_strides = workspace.stride()[:3] if num_splits > 1 else (0, 0, 0)
    group = num_heads // num_kv_heads
    block_d = max(16, next_power_of_2(head_dim))
    is_int8 = k_scales is not None
    if not is_int8:  # placeholders, never read
        k_scales = v_scales = k_cache
    use_pdl = pdl.enabled(q)
    launch_first_fitting(
        _decode_split_kernel,
        (num_seqs, num_kv_heads, num_splits),
        tile_configs(block_d),
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        ws,
        out,
        k_scales,
        v_scales,
        variant[2],
        scale * LOG2E,
        *variant[:2],
        num_splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        *(k_scales.stride()[:2] if is_int8 else (0, 0)),
        block_tables.stride(0),
        *ws_strides,
        out.stride(0),
        out.stride(1),
        GROUP=group,
        BLOCK_G=max(16, next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        DIRECT_OUT=num_splits == 1,
        DOT_DTYPE=dot_dtype(q.dtype, _decode_split_kernel),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_INT8=is_int8,
        **flags,
        PDL=use_pdl,
        launch_pdl=use_pdl,
    )
    if num_splits > 1:
        _decode_merge_kernel[(num_seqs, num_heads)](
            ws,
            out,
            variant[2],
            num_splits,
            *ws_strides,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_P=merge_block(num_splits),
            SINKS=flags["SINKS"],
            PDL=use_pdl,
            num_warps=4,
            launch_pdl=use_pdl,
        )
    return out
