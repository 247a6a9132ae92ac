"""Fused mixture of experts for a few tokens (decode at batch 1-4): matrix-vector products that
read each (token, slot) pair's expert directly from topk_ids, with no sort and no slot-sum
launch. engine/kernels/moe.py's fused_moe calls this for such batches; layout, quantized
formats and meaning are its own (engine/kernels/moe_ref.py's fused_moe_ref).

- _gate_up_pairs_kernel: one program per (pair, BLOCK_N gate/up columns): the pair's x row
  times its expert's gate and up rows, bias and activation, into h [num_pairs, inter].
- _down_sum_kernel: one program per (token, BLOCK_N output columns): for each of the token's
  k pairs, h's row times its expert's down rows, plus bias, times the routing weight, summed
  in fp32 and written once in x's dtype.

Two tokens routed to the same expert read its weights twice, so the sorted grouped GEMMs of
moe.py win once tokens share experts; with one token every expert is distinct. Two launches
in all, and nothing waits on the host (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import pdl
from engine.kernels.launch_math import cdiv
from engine.kernels.moe_ref import ACTIVATIONS, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from engine.kernels.moe_tiles import act_and_mul, block_k_for, weight_tile
from engine.kernels.paged_args import dot_dtype

MAX_TOKENS = 4
"""Up to this many tokens fused_moe takes this path (k distinct experts a token, few shared)."""
GATE_UP_BLOCK_N, DOWN_BLOCK_N, BLOCK_K = 16, 8, 256
"""Narrow N tiles, so a batch-1 step's few experts still spread over every SM (Qwen3-30B-A3B:
8 pairs x 768 / 16 = 384 gate/up programs, 2,048 / 8 = 256 down programs), and long K steps,
so each program has many weight bytes in flight."""


@triton.jit
def _gate_up_pairs_kernel(
    x_ptr,  # [num_tokens, hidden]
    w_ptr,  # [num_experts, 2 * inter, hidden] (int4: hidden / 2 bytes a row)
    b_ptr,  # [num_experts, 2 * inter] (HAS_BIAS)
    s_ptr,  # fp32 scales: int8 [num_experts, 2 * inter], int4 [.., hidden / GROUP]
    code_ptr,  # [16] fp32 int4 table
    ids_ptr,  # [num_pairs] expert of each pair
    h_ptr,  # [num_pairs, inter] out
    hidden,
    inter,
    TOPK: tl.constexpr,
    ACTIVATION: tl.constexpr,
    LIMIT: tl.constexpr,
    ALPHA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WKIND: tl.constexpr,
    GROUP: tl.constexpr,
    W_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)  # engine/kernels/pdl.py: the expert to read is only known after the wait
    pair = tl.program_id(0).to(tl.int64)
    token = pair // TOPK
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < inter
    w_cols = hidden // 2 if WKIND == 2 else hidden  # stored columns a row
    g_index = expert * 2 * inter + offs_n  # [BLOCK_N] gate rows (up: + inter)
    g_rows = w_ptr + g_index[:, None] * w_cols  # [BLOCK_N, 1]
    u_rows = g_rows + inter * w_cols
    g_scales = s_ptr + g_index * (hidden // GROUP)  # [BLOCK_N] (int4)
    u_scales = g_scales + inter * (hidden // GROUP)
    acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + token * hidden + offs_k, mask=offs_k < hidden, other=0.0)
        x = x.to(tl.float32)[None, :]  # [1, BLOCK_K]
        g = weight_tile(
            g_rows, g_scales, code_ptr, k0, hidden, n_mask, WKIND, GROUP, BLOCK_K, W_DTYPE
        )
        u = weight_tile(
            u_rows, u_scales, code_ptr, k0, hidden, n_mask, WKIND, GROUP, BLOCK_K, W_DTYPE
        )
        acc_g += tl.sum(g.to(tl.float32) * x, axis=1)
        acc_u += tl.sum(u.to(tl.float32) * x, axis=1)
    if WKIND == 1:  # int8: each output column times its row's scale
        acc_g *= tl.load(s_ptr + g_index, mask=n_mask, other=0.0)
        acc_u *= tl.load(s_ptr + g_index + inter, mask=n_mask, other=0.0)
    if HAS_BIAS:
        acc_g += tl.load(b_ptr + g_index, mask=n_mask, other=0.0).to(tl.float32)
        acc_u += tl.load(b_ptr + g_index + inter, mask=n_mask, other=0.0).to(tl.float32)
    h = act_and_mul(acc_g, acc_u, ACTIVATION, LIMIT, ALPHA)
    tl.store(h_ptr + pair * inter + offs_n, h.to(h_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _down_sum_kernel(
    h_ptr,  # [num_pairs, inter]
    w_ptr,  # [num_experts, hidden, inter] (int4: inter / 2 bytes a row)
    b_ptr,  # [num_experts, hidden] (HAS_BIAS)
    s_ptr,  # fp32 scales: int8 [num_experts, hidden], int4 [.., inter / GROUP]
    code_ptr,  # [16] fp32 int4 table
    ids_ptr,  # [num_pairs] expert of each pair
    weights_ptr,  # [num_pairs] fp32 routing weights
    out_ptr,  # [num_tokens, hidden] out
    hidden,
    inter,
    TOPK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WKIND: tl.constexpr,
    GROUP: tl.constexpr,
    W_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    w_cols = inter // 2 if WKIND == 2 else inter
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOPK):
        pair = token * TOPK + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        w_index = expert * hidden + offs_n  # [BLOCK_N]
        w_rows = w_ptr + w_index[:, None] * w_cols  # [BLOCK_N, 1]
        w_scales = s_ptr + w_index * (inter // GROUP)  # [BLOCK_N] (int4)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            h = tl.load(h_ptr + pair * inter + offs_k, mask=offs_k < inter, other=0.0)
            w = weight_tile(
                w_rows, w_scales, code_ptr, k0, inter, n_mask, WKIND, GROUP, BLOCK_K, W_DTYPE
            )
            acc += tl.sum(w.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
        if WKIND == 1:
            acc *= tl.load(s_ptr + w_index, mask=n_mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + w_index, mask=n_mask, other=0.0).to(tl.float32)
        total += acc * tl.load(weights_ptr + pair)
    out = out_ptr + token * hidden + offs_n
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=n_mask)


def fused_moe_pairs(
    x: torch.Tensor,  # [num_tokens, hidden]
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,  # [num_tokens, k] fp32
    topk_ids: torch.Tensor,  # [num_tokens, k]
    activation: str,
    b_gate_up: torch.Tensor | None,
    b_down: torch.Tensor | None,
    gate_up_scales: torch.Tensor | None,
    down_scales: torch.Tensor | None,
    code: torch.Tensor | None,
    group_size: int,
) -> torch.Tensor:  # [num_tokens, hidden]
    """fused_moe's result by the two kernels above; arguments already checked by fused_moe."""
    num_tokens, hidden = x.shape
    wkind = {torch.int8: 1, torch.uint8: 2}.get(w_down.dtype, 0)
    inter = w_down.shape[2] * (2 if wkind == 2 else 1)
    k = topk_ids.shape[1]
    group = group_size if wkind == 2 else 1
    w_dtype = dot_dtype(x.dtype, _gate_up_pairs_kernel)  # weights rounded to this, as moe.py
    use_pdl = pdl.enabled(x)  # one token: batch-1 decode
    common = {"WKIND": wkind, "GROUP": group, "W_DTYPE": w_dtype, "num_warps": 4}
    common |= {"PDL": use_pdl, "launch_pdl": use_pdl}
    ids = topk_ids.reshape(-1)
    h = torch.empty(num_tokens * k, inter, dtype=x.dtype, device=x.device)  # [pairs, inter]
    _gate_up_pairs_kernel[(num_tokens * k, cdiv(inter, GATE_UP_BLOCK_N))](
        x,
        w_gate_up,
        b_gate_up if b_gate_up is not None else x,
        gate_up_scales if gate_up_scales is not None else x,
        code if code is not None else x,
        ids,
        h,
        hidden,
        inter,
        TOPK=k,
        ACTIVATION=ACTIVATIONS.index(activation),
        LIMIT=SWIGLU_OAI_LIMIT,
        ALPHA=SWIGLU_OAI_ALPHA,
        HAS_BIAS=b_gate_up is not None,
        BLOCK_N=GATE_UP_BLOCK_N,
        BLOCK_K=block_k_for(BLOCK_K, hidden, wkind, group),
        **common,
    )
    out = torch.empty_like(x)
    _down_sum_kernel[(num_tokens, cdiv(hidden, DOWN_BLOCK_N))](
        h,
        w_down,
        b_down if b_down is not None else x,
        down_scales if down_scales is not None else x,
        code if code is not None else x,
        ids,
        topk_weights,
        out,
        hidden,
        inter,
        TOPK=k,
        HAS_BIAS=b_down is not None,
        BLOCK_N=DOWN_BLOCK_N,
        BLOCK_K=block_k_for(BLOCK_K, inter, wkind, group),
        **common,
    )
    return out
