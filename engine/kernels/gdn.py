"""Triton kernel of the gated delta rule over a packed batch, token by token (the fused
recurrent form): decode steps, and prefill chunks until a chunked kernel takes those.

Same contract as engine/kernels/gdn_ref.py's gated_delta_rule_varlen (layout and state pool in
gdn_args.py). One program per (sequence, value head, Dv tile) keeps its [Dk, BLOCK_V] slice of
the fp32 state in registers and walks the sequence's tokens: L2-normalise q and k, scale q,
decay the state, apply the delta-rule update, write o_t; then stores the slice back to the
sequence's slot. Slot ids, fresh flags and query_start_loc are read on the device: no host
sync and no allocation but the output, so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gdn_args import check_batch, check_delta_rule, default_scale
from engine.kernels.gdn_ref import L2NORM_EPS
from engine.kernels.launch_math import cdiv, next_power_of_2

BLOCK_V = 32
"""Value columns a program: at Dk = Dv = 128 a [128, 32] fp32 state tile, Hv * 4 programs a
decoding sequence; 127 registers a thread at 4 warps, no spills, built for sm_90 by Triton 3.6
(tests/support/gdn_sm90_compile.py, then cuobjdump --dump-resource-usage; 16 columns: 72, 64
columns: 228)."""


@triton.jit
def _recurrent_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    out_ptr,
    states_ptr,
    query_start_loc_ptr,
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
    L2NORM: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    key_head = head // GROUP
    start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    end = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    is_fresh = tl.load(fresh_ptr + seq).to(tl.int1)
    # Slot and fresh flag fold into the key bound of the state's masks (Triton's interpreter
    # takes no scalar in a mask): zero rows when fresh or padding, no store for padding.
    read_rows = tl.where((slot >= 0) & (is_fresh == 0), KEY_DIM, 0)
    store_rows = tl.where(slot >= 0, KEY_DIM, 0)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < KEY_DIM
    mask_v = offs_v < VALUE_DIM
    # [BLOCK_K, BLOCK_V] pointers into this program's slice of the slot's [Dk, Dv] state
    state_base = states_ptr + (tl.maximum(slot, 0) * NUM_V_HEADS + head) * KEY_DIM * VALUE_DIM
    state_ptrs = state_base + offs_k[:, None] * VALUE_DIM + offs_v[None, :]
    state = tl.load(state_ptrs, mask=(offs_k < read_rows)[:, None] & mask_v[None, :], other=0.0)
    dtype = out_ptr.dtype.element_ty
    for t in range(start, end):
        # [BLOCK_K]
        q = tl.load(q_ptr + t * stride_qt + key_head * stride_qh + offs_k, mask=mask_k, other=0.0)
        k = tl.load(k_ptr + t * stride_kt + key_head * stride_kh + offs_k, mask=mask_k, other=0.0)
        q = q.to(tl.float32)
        k = k.to(tl.float32)
        if L2NORM:
            q = q / tl.sqrt(tl.sum(q * q, 0) + eps)
            k = k / tl.sqrt(tl.sum(k * k, 0) + eps)
        q = q * scale
        # [BLOCK_V]
        v = tl.load(v_ptr + t * stride_vt + head * stride_vh + offs_v, mask=mask_v, other=0.0)
        decay = tl.exp(tl.load(g_ptr + t * stride_gt + head).to(tl.float32))
        beta = tl.load(beta_ptr + t * stride_bt + head).to(tl.float32)
        state = state * decay
        delta = (v.to(tl.float32) - tl.sum(state * k[:, None], 0)) * beta
        state = state + k[:, None] * delta[None, :]
        o = tl.sum(state * q[:, None], 0)
        out_row = out_ptr + (t * NUM_V_HEADS + head) * VALUE_DIM
        tl.store(out_row + offs_v, o.to(dtype), mask=mask_v)
    tl.store(state_ptrs, state, mask=(offs_k < store_rows)[:, None] & mask_v[None, :])


def gated_delta_rule_varlen(
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
    block_v: int = BLOCK_V,
) -> torch.Tensor:  # [num_tokens, Hv, Dv] in v's dtype
    """gdn_ref.gated_delta_rule_varlen on the GPU (or the interpreter), token by token. q, k, v
    may be strided views (e.g. of the conv output) with a unit-stride last dim; g and beta any
    float dtype with a unit-stride head dim; states contiguous."""
    check_delta_rule(q, k, v, g, beta, states)
    check_batch("gated_delta_rule_varlen", q.shape[0], query_start_loc, slots, fresh, q.device)
    for label, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"gated_delta_rule_varlen: {label} needs a unit-stride last dim, "
                f"got strides {t.stride()}"
            )
    if not states.is_contiguous():
        raise ValueError("gated_delta_rule_varlen: states must be contiguous")
    num_tokens, num_k_heads, key_dim = q.shape
    num_v_heads, value_dim = v.shape[1:]
    out = torch.empty(num_tokens, num_v_heads, value_dim, dtype=v.dtype, device=v.device)
    num_seqs = slots.shape[0]
    block_v = min(block_v, next_power_of_2(value_dim))
    if num_seqs == 0:
        return out
    grid = (num_seqs, num_v_heads, cdiv(value_dim, block_v))
    _recurrent_kernel[grid](
        q,
        k,
        v,
        g,
        beta,
        out,
        states,
        query_start_loc,
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
        NUM_V_HEADS=num_v_heads,
        GROUP=num_v_heads // num_k_heads,
        KEY_DIM=key_dim,
        VALUE_DIM=value_dim,
        BLOCK_K=next_power_of_2(key_dim),
        BLOCK_V=block_v,
        L2NORM=use_qk_l2norm,
        num_warps=4,
    )
    return out
