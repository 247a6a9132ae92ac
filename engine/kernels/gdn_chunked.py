"""Triton kernels of the gated delta rule by chunks, for prefill: the same contract as
engine/kernels/gdn_ref.py's gated_delta_rule_chunked (layout and state pool in gdn_args.py),
the form of gdn_ref._chunked_one's docstring, CHUNK tokens at a time.

Two launches:
1. one program per (sequence, value head, chunk split) walks its share of the sequence's chunks
   and writes each chunk's T = (I + A)^-1 (A the chunk's strictly lower [CHUNK, CHUNK] matrix
   beta_t gamma_t / gamma_i (k_t . k_i)) to a workspace, by forward substitution: the serial
   part of a chunk, done for all chunks in parallel;
2. one program per (sequence, value head, BLOCK_V value columns) keeps its [Dk, BLOCK_V] slice
   of the fp32 state in registers and walks the sequence's chunks in order, all in matmuls:
   corrections U = T (beta V) - T (beta gamma K) S, outputs (gamma Q) S + (QK^T * decay) U,
   state gamma_C S + (K * gamma_C / gamma)^T U.
The chunks' workspace is sized from shapes alone (at most num_tokens / CHUNK + num_seqs
chunks) and each sequence's first chunk is found on the device: no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import gdn, interpreting
from engine.kernels.gdn_args import check_batch, check_delta_rule, default_scale
from engine.kernels.gdn_ref import L2NORM_EPS
from engine.kernels.launch_math import cdiv, next_power_of_2

# Built for sm_90 by Triton 3.6 at Qwen3.5-27B's shape in bf16 (tests/support/gdn_sm90_compile.py,
# then cuobjdump --dump-resource-usage), one pipeline stage: the inverse kernel 212 registers a
# thread at 8 warps, no spills; the scan kernel 255 registers and 520 bytes of spills at 8 warps
# and 16 value columns (32 columns, 3 stages or 4 warps each spilled more; 16 warps 1128 bytes);
# fp32 activations (tf32x3 matmuls) 2664 bytes. A 32-token chunk (chunk_size=32) at 8 warps
# spills nothing, for twice the serial steps: benchmarks/kernels/bench_gdn.py --chunk-sizes 64,32
# times both.
CHUNK = 64
BLOCK_V = 16
MAX_SPLITS = 64
"""Chunk splits a sequence at most in the first launch."""
_DOT_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
"""The chunk matmuls' operand dtype by the activations' dtype (fp32 accumulation): 16-bit
activations round q, k, the inverses and the state's copy to their dtype for the tensor cores,
the fp32 state itself accumulating in fp32. Under the interpreter always fp32: Triton 3.9's
interpreter computes bf16 arithmetic and dots wrongly (a bf16 tl.dot of a 16x16 randn matrix
with itself came out ~1e10)."""
PRECISION = "tf32x3"
"""tl.dot's input precision for the fp32 operands: three TF32 products, about fp32's accuracy on
the tensor cores (plain TF32 rounds to 10 mantissa bits, which the state would accumulate)."""


@triton.jit
def _load_keys(k_ptr, rows, row_mask, offs_k, mask_k, stride_t, eps, L2NORM: tl.constexpr):
    """[CHUNK, BLOCK_K] fp32 rows of q or k (zeros past the sequence), L2-normalised."""
    ptrs = k_ptr + rows[:, None] * stride_t + offs_k[None, :]
    x = tl.load(ptrs, mask=row_mask[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, 1) + eps)[:, None]
    return x


@triton.jit
def _mm(a, b, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """a @ b with fp32 accumulation, operands rounded to DOT_DTYPE (_DOT_DTYPES)."""
    if DOT_DTYPE == tl.float32:
        return tl.dot(a, b, input_precision=PRECISION)
    return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE))


@triton.jit
def _inverse_kernel(
    k_ptr,
    g_ptr,
    beta_ptr,
    inv_ptr,
    query_start_loc_ptr,
    chunk_offsets_ptr,
    stride_kt,
    stride_kh,
    stride_gt,
    stride_bt,
    eps,
    NUM_V_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNK: tl.constexpr,
    L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    end = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64)
    first_chunk = tl.load(chunk_offsets_ptr + seq).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < KEY_DIM
    offs_c = tl.arange(0, CHUNK)
    strictly_lower = offs_c[:, None] > offs_c[None, :]
    identity = tl.where(offs_c[:, None] == offs_c[None, :], 1.0, 0.0)
    k_head = k_ptr + (head // GROUP) * stride_kh
    for c0 in range(start + split * CHUNK, end, num_splits * CHUNK):
        rows = c0 + offs_c  # [CHUNK]
        row_mask = rows < end
        k = _load_keys(k_head, rows, row_mask, offs_k, mask_k, stride_kt, eps, L2NORM)
        beta = tl.load(beta_ptr + rows * stride_bt + head, mask=row_mask, other=0.0)
        g = tl.load(g_ptr + rows * stride_gt + head, mask=row_mask, other=0.0).to(tl.float32)
        log_gamma = tl.cumsum(g, 0)
        log_ratio = tl.where(strictly_lower, log_gamma[:, None] - log_gamma[None, :], -float("inf"))
        kk = _mm(k, tl.trans(k), DOT, PRECISION)  # [CHUNK, CHUNK]
        a = beta.to(tl.float32)[:, None] * kk * tl.exp(log_ratio)
        # Row t of T: e_t - sum_{i<t} A[t, i] T[i]; rows before t are final when row t is made.
        inv = identity
        for t in range(1, CHUNK):
            a_row = tl.sum(tl.where(offs_c[:, None] == t, a, 0.0), 0)  # [CHUNK] A[t, :]
            update = tl.sum(a_row[:, None] * inv, 0)  # [CHUNK] sum_i A[t, i] T[i, :]
            inv = tl.where(offs_c[:, None] == t, inv - update[None, :], inv)
        chunk = first_chunk + (c0 - start) // CHUNK
        out = inv_ptr + (chunk * NUM_V_HEADS + head) * CHUNK * CHUNK
        tl.store(out + offs_c[:, None] * CHUNK + offs_c[None, :], inv)


@triton.jit
def _scan_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    out_ptr,
    states_ptr,
    inv_ptr,
    query_start_loc_ptr,
    chunk_offsets_ptr,
    slots_ptr,
    fresh_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_bt,
    scale,
    eps,
    NUM_V_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    CHUNK: tl.constexpr,
    L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    end = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64)
    first_chunk = tl.load(chunk_offsets_ptr + seq).to(tl.int64)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    is_fresh = tl.load(fresh_ptr + seq).to(tl.int1)
    # Slot and fresh flag fold into the key bound of the state's masks (as in gdn.py)
    read_rows = tl.where((slot >= 0) & (is_fresh == 0), KEY_DIM, 0)
    store_rows = tl.where(slot >= 0, KEY_DIM, 0)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_c = tl.arange(0, CHUNK)
    mask_k = offs_k < KEY_DIM
    mask_v = offs_v < VALUE_DIM
    causal = offs_c[:, None] >= offs_c[None, :]
    state_base = states_ptr + (tl.maximum(slot, 0) * NUM_V_HEADS + head) * KEY_DIM * VALUE_DIM
    state_ptrs = state_base + offs_k[:, None] * VALUE_DIM + offs_v[None, :]
    # [BLOCK_K, BLOCK_V]
    state = tl.load(state_ptrs, mask=(offs_k < read_rows)[:, None] & mask_v[None, :], other=0.0)
    q_head = q_ptr + (head // GROUP) * stride_qh
    k_head = k_ptr + (head // GROUP) * stride_kh
    dtype = out_ptr.dtype.element_ty
    for c0 in range(start, end, CHUNK):
        rows = c0 + offs_c  # [CHUNK]
        row_mask = rows < end
        q = _load_keys(q_head, rows, row_mask, offs_k, mask_k, stride_qt, eps, L2NORM) * scale
        k = _load_keys(k_head, rows, row_mask, offs_k, mask_k, stride_kt, eps, L2NORM)
        v_ptrs = v_ptr + rows[:, None] * stride_vt + head * stride_vh + offs_v[None, :]
        v = tl.load(v_ptrs, mask=row_mask[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + rows * stride_bt + head, mask=row_mask, other=0.0)
        beta = beta.to(tl.float32)
        g = tl.load(g_ptr + rows * stride_gt + head, mask=row_mask, other=0.0).to(tl.float32)
        log_gamma = tl.cumsum(g, 0)  # [CHUNK]; rows past the end add 0: the last is the chunk's
        gamma = tl.exp(log_gamma)
        log_last = tl.sum(tl.where(offs_c == CHUNK - 1, log_gamma, 0.0), 0)
        chunk = first_chunk + (c0 - start) // CHUNK
        inv_rows = inv_ptr + (chunk * NUM_V_HEADS + head) * CHUNK * CHUNK
        inv = tl.load(inv_rows + offs_c[:, None] * CHUNK + offs_c[None, :])  # [CHUNK, CHUNK]
        # corrections U [CHUNK, BLOCK_V] = T (beta V) - T (beta gamma K) S
        w_k = _mm(inv, k * (beta * gamma)[:, None], DOT, PRECISION)
        u = _mm(inv, v * beta[:, None], DOT, PRECISION)
        u -= _mm(w_k, state, DOT, PRECISION)
        # outputs (gamma Q) S + (Q K^T * gamma_t / gamma_i, i <= t) U
        log_ratio = tl.where(causal, log_gamma[:, None] - log_gamma[None, :], -float("inf"))
        qk = _mm(q, tl.trans(k), DOT, PRECISION) * tl.exp(log_ratio)
        o = _mm(q * gamma[:, None], state, DOT, PRECISION)
        o += _mm(qk, u, DOT, PRECISION)
        out_ptrs = out_ptr + (rows[:, None] * NUM_V_HEADS + head) * VALUE_DIM + offs_v[None, :]
        tl.store(out_ptrs, o.to(dtype), mask=row_mask[:, None] & mask_v[None, :])
        # state gamma_C S + (K * gamma_C / gamma)^T U
        k_to_end = k * tl.exp(log_last - log_gamma)[:, None]
        state = state * tl.exp(log_last)
        state += _mm(tl.trans(k_to_end), u, DOT, PRECISION)
    tl.store(state_ptrs, state, mask=(offs_k < store_rows)[:, None] & mask_v[None, :])


def gated_delta_rule_chunked(
    q: torch.Tensor,  # [num_tokens, Hk, Dk]
    k: torch.Tensor,  # [num_tokens, Hk, Dk]
    v: torch.Tensor,  # [num_tokens, Hv, Dv]
    g: torch.Tensor,  # [num_tokens, Hv] log decay
    beta: torch.Tensor,  # [num_tokens, Hv]
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] float32, updated in place
    query_start_loc: torch.Tensor,  # [num_seqs + 1]
    slots: torch.Tensor,  # [num_seqs]
    fresh: torch.Tensor,  # [num_seqs] bool
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    out: torch.Tensor | None = None,  # [num_tokens, Hv, Dv]: written at the sequences' rows
    chunk_size: int = CHUNK,
) -> torch.Tensor:  # [num_tokens, Hv, Dv] in v's dtype
    """gdn_ref.gated_delta_rule_chunked on the GPU (or the interpreter), in chunks of CHUNK
    tokens. Rows are absolute: query_start_loc may be a slice of a bigger batch's (e.g. its
    prefills, after gdn.gated_delta_rule_varlen ran its decodes into the same `out`). q, k, v
    may be strided views with a unit-stride last dim; states contiguous. chunk_size: a power
    of two from 16 (tests take small ones)."""
    check_delta_rule(q, k, v, g, beta, states)
    check_batch("gated_delta_rule_chunked", q.shape[0], query_start_loc, slots, fresh, q.device)
    for label, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"gated_delta_rule_chunked: {label} needs a unit-stride last dim, got strides "
                f"{t.stride()}"
            )
    if not states.is_contiguous():
        raise ValueError("gated_delta_rule_chunked: states must be contiguous")
    num_tokens, num_k_heads, key_dim = q.shape
    num_v_heads, value_dim = v.shape[1:]
    if value_dim < 16 or key_dim < 16:
        raise ValueError(
            f"gated_delta_rule_chunked: Dk {key_dim} and Dv {value_dim} must be at least 16 "
            f"(tl.dot's smallest tile); use gdn.gated_delta_rule_varlen"
        )
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(
            f"gated_delta_rule_chunked: chunk_size {chunk_size}; pass a power of two from 16"
        )
    if out is None:
        out = torch.empty(num_tokens, num_v_heads, value_dim, dtype=v.dtype, device=v.device)
    elif out.shape != v.shape or out.dtype != v.dtype or not out.is_contiguous():
        raise ValueError(
            f"gated_delta_rule_chunked: out must be contiguous {tuple(v.shape)} "
            f"{v.dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    num_seqs = slots.shape[0]
    if num_seqs == 0 or num_tokens == 0:
        return out
    # [num_seqs] the first chunk of each sequence in the workspace (exclusive cumsum)
    lengths = query_start_loc[1:] - query_start_loc[:-1]
    counts = (lengths + chunk_size - 1) // chunk_size
    chunk_offsets = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    max_chunks = cdiv(num_tokens, chunk_size) + num_seqs
    inverses = torch.empty(max_chunks, num_v_heads, chunk_size, chunk_size, device=q.device)
    heads = dict(NUM_V_HEADS=num_v_heads, GROUP=num_v_heads // num_k_heads, KEY_DIM=key_dim)
    common = dict(**heads, BLOCK_K=next_power_of_2(key_dim), CHUNK=chunk_size, L2NORM=use_qk_l2norm)
    common["DOT"] = tl.float32 if interpreting() else _DOT_DTYPES[v.dtype]
    num_splits = max(1, min(MAX_SPLITS, cdiv(cdiv(num_tokens, chunk_size), num_seqs)))
    _inverse_kernel[(num_seqs, num_v_heads, num_splits)](
        k,
        g,
        beta,
        inverses,
        query_start_loc,
        chunk_offsets,
        k.stride(0),
        k.stride(1),
        g.stride(0),
        beta.stride(0),
        L2NORM_EPS,
        **common,
        PRECISION=PRECISION,
        num_warps=8,
        num_stages=1,
    )
    block_v = min(BLOCK_V, next_power_of_2(value_dim))
    _scan_kernel[(num_seqs, num_v_heads, cdiv(value_dim, block_v))](
        q,
        k,
        v,
        g,
        beta,
        out,
        states,
        inverses,
        query_start_loc,
        chunk_offsets,
        slots,
        fresh,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        g.stride(0),
        beta.stride(0),
        default_scale(key_dim, scale),
        L2NORM_EPS,
        **common,
        VALUE_DIM=value_dim,
        BLOCK_V=block_v,
        PRECISION=PRECISION,
        num_warps=8,
        num_stages=1,
    )
    return out


def gated_delta_rule_mixed(
    q: torch.Tensor,  # [num_tokens, Hk, Dk]
    k: torch.Tensor,  # [num_tokens, Hk, Dk]
    v: torch.Tensor,  # [num_tokens, Hv, Dv]
    g: torch.Tensor,  # [num_tokens, Hv] log decay
    beta: torch.Tensor,  # [num_tokens, Hv]
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] float32, updated in place
    query_start_loc: torch.Tensor,  # [num_seqs + 1]
    slots: torch.Tensor,  # [num_seqs]
    fresh: torch.Tensor,  # [num_seqs] bool
    num_decodes: int,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:  # [num_tokens, Hv, Dv] in v's dtype
    """A step as the engine packs it (engine/runner/forward_context.py): the first num_decodes
    sequences one token each through the recurrent kernel (gdn.py), the prefill chunks after them
    through the chunked kernels (the recurrent one when Dk or Dv is under tl.dot's 16), into one
    output. num_decodes is host data the step already has; nothing else is read on the host."""
    num_seqs = slots.shape[0]
    if not 0 <= num_decodes <= num_seqs:
        raise ValueError(f"gated_delta_rule_mixed: num_decodes {num_decodes} of {num_seqs} seqs")
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    rule = (q, k, v, g, beta, states)
    if num_decodes:
        pack = (query_start_loc[: num_decodes + 1], slots[:num_decodes], fresh[:num_decodes])
        gdn.gated_delta_rule_varlen(*rule, *pack, scale, use_qk_l2norm, out=out)
    if num_decodes < num_seqs:
        pack = (query_start_loc[num_decodes:], slots[num_decodes:], fresh[num_decodes:])
        by_chunks = min(k.shape[2], v.shape[2]) >= 16
        prefill = gated_delta_rule_chunked if by_chunks else gdn.gated_delta_rule_varlen
        prefill(*rule, *pack, scale, use_qk_l2norm, out=out)
    return out
