"""Fused mixture of experts on the GPU (Triton): the (token, slot) pairs sorted by expert into
tiles (engine/kernels/moe_align.py), then two grouped GEMMs over the tiles, each tile one
expert's weights, and an fp32 sum of each token's k slots. Layout and meaning are
engine/kernels/moe_ref.py's fused_moe_ref.

- GEMM 1 (_gate_up_kernel): a tile's x rows, gathered by token, times its expert's gate rows and
  up rows (two accumulators over the same x tile), bias and activation in the epilogue: one
  [rows, inter] output in x's dtype.
- GEMM 2 (_down_kernel): those rows times the expert's w_down, plus its bias, times the pair's
  routing weight in fp32, written in x's dtype to the pair's own row of [num_tokens * k, hidden].
- _sum_slots_kernel: out[t] = the sum in fp32 of rows t * k .. t * k + k - 1, in x's dtype.
int8 experts (engine/quant/format.py's per-row layout, one scale per output row): each weight
tile widens to x's dtype in the K loop (exact for int8) and the row scale multiplies the fp32
sum in the epilogue, so a weight costs one byte of traffic.

A program reads its expert's weight rows once; with at most BLOCK_M pairs an expert (decode)
an expert is one tile, so each active expert's weights are read once a step and an expert with
no pair is never read. Nothing waits on the host: buffers have worst-case shapes known from the
input shapes, and tiles past the used rows exit at once, so a decode step can be captured in a
CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.launch_math import cdiv
from engine.kernels.moe_align import align_by_expert
from engine.kernels.moe_args import MoeConfig, check_args, config_for
from engine.kernels.moe_ref import ACTIVATIONS, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from engine.kernels.paged_args import dot_dtype


@triton.jit
def _act_and_mul(gate, up, ACTIVATION: tl.constexpr, LIMIT: tl.constexpr, ALPHA: tl.constexpr):
    """moe_ref.act_and_mul on fp32 tiles; ACTIVATION indexes moe_ref.ACTIVATIONS."""
    if ACTIVATION == 0:  # silu
        return gate * tl.sigmoid(gate) * up
    elif ACTIVATION == 1:  # gelu_tanh: 0.5 * (1 + tanh(z)) = sigmoid(2z)
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        return gate * tl.sigmoid(2.0 * z) * up
    else:  # swiglu_oai
        gate = tl.minimum(gate, LIMIT)
        up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        return (up + 1.0) * (gate * tl.sigmoid(gate * ALPHA))


@triton.jit(do_not_specialize=["num_pairs"])
def _gate_up_kernel(
    x_ptr,  # [num_tokens, hidden]
    w_ptr,  # [num_experts, 2 * inter, hidden]
    b_ptr,  # [num_experts, 2 * inter] (HAS_BIAS)
    s_ptr,  # [num_experts, 2 * inter] fp32 row scales of int8 weights (W_SCALED)
    sorted_ptr,  # [rows] int32 pair per sorted row
    tile_expert_ptr,  # [tiles] int32
    h_ptr,  # [rows, inter] out
    num_pairs,
    hidden,
    inter,
    TOPK: tl.constexpr,
    ACTIVATION: tl.constexpr,
    LIMIT: tl.constexpr,
    ALPHA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    W_SCALED: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(tile_expert_ptr + pid_m)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)  # [BLOCK_M]
    valid = pair < num_pairs
    token = (pair // TOPK).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < inter
    x_rows = x_ptr + token[:, None] * hidden  # [BLOCK_M, 1]
    w_expert = w_ptr + expert.to(tl.int64) * 2 * inter * hidden
    g_rows = w_expert + offs_n[:, None].to(tl.int64) * hidden  # [BLOCK_N, 1]
    u_rows = g_rows + inter * hidden
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k[None, :] < hidden
        x = tl.load(x_rows + offs_k[None, :], mask=valid[:, None] & k_mask, other=0.0)
        g = tl.load(g_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask, other=0)
        u = tl.load(u_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask, other=0)
        x, g, u = x.to(DOT_DTYPE), g.to(DOT_DTYPE), u.to(DOT_DTYPE)
        acc_g = tl.dot(x, tl.trans(g), acc_g, input_precision=PRECISION)
        acc_u = tl.dot(x, tl.trans(u), acc_u, input_precision=PRECISION)
    if W_SCALED:  # int8 weights (exact in DOT_DTYPE): each output column times its row scale
        s_expert = s_ptr + expert.to(tl.int64) * 2 * inter
        acc_g *= tl.load(s_expert + offs_n, mask=n_mask, other=0.0)[None, :]
        acc_u *= tl.load(s_expert + inter + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        b_expert = b_ptr + expert.to(tl.int64) * 2 * inter
        acc_g += tl.load(b_expert + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(b_expert + inter + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    h = _act_and_mul(acc_g, acc_u, ACTIVATION, LIMIT, ALPHA)
    out = h_ptr + rows.to(tl.int64)[:, None] * inter + offs_n[None, :]
    tl.store(out, h.to(h_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def _down_kernel(
    h_ptr,  # [rows, inter]
    w_ptr,  # [num_experts, hidden, inter]
    b_ptr,  # [num_experts, hidden] (HAS_BIAS)
    s_ptr,  # [num_experts, hidden] fp32 row scales of int8 weights (W_SCALED)
    sorted_ptr,  # [rows] int32
    tile_expert_ptr,  # [tiles] int32
    weights_ptr,  # [num_pairs] fp32 routing weights
    y_ptr,  # [num_pairs, hidden] out
    num_pairs,
    hidden,
    inter,
    HAS_BIAS: tl.constexpr,
    W_SCALED: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(tile_expert_ptr + pid_m)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)  # [BLOCK_M]
    valid = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * inter  # [BLOCK_M, 1]
    w_rows = w_ptr + expert.to(tl.int64) * hidden * inter + offs_n[:, None].to(tl.int64) * inter
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k[None, :] < inter
        h = tl.load(h_rows + offs_k[None, :], mask=valid[:, None] & k_mask, other=0.0)
        w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask, other=0)
        acc = tl.dot(h.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc, input_precision=PRECISION)
    if W_SCALED:
        acc *= tl.load(s_ptr + expert.to(tl.int64) * hidden + offs_n, mask=n_mask, other=0.0)[
            None, :
        ]
    if HAS_BIAS:
        bias = tl.load(b_ptr + expert.to(tl.int64) * hidden + offs_n, mask=n_mask, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    acc *= tl.load(weights_ptr + pair, mask=valid, other=0.0)[:, None]
    out = y_ptr + pair.to(tl.int64)[:, None] * hidden + offs_n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _sum_slots_kernel(y_ptr, out_ptr, hidden, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(TOPK):
        total += tl.load(y_ptr + (token * TOPK + j) * hidden + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + token * hidden + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def fused_moe(
    x: torch.Tensor,  # [num_tokens, hidden]
    w_gate_up: torch.Tensor,  # [num_experts, 2 * inter, hidden]
    w_down: torch.Tensor,  # [num_experts, hidden, inter]
    topk_weights: torch.Tensor,  # [num_tokens, k] fp32
    topk_ids: torch.Tensor,  # [num_tokens, k] int32 / int64, each in [0, num_experts)
    activation: str = "silu",
    b_gate_up: torch.Tensor | None = None,
    b_down: torch.Tensor | None = None,
    *,
    gate_up_scales: torch.Tensor | None = None,  # [num_experts, 2 * inter] fp32 (int8)
    down_scales: torch.Tensor | None = None,  # [num_experts, hidden] fp32 (int8)
    config: MoeConfig | None = None,
) -> torch.Tensor:  # [num_tokens, hidden]
    """fused_moe_ref's result (module docstring says how). With scales, both weights are int8
    in engine/quant/format.py's per-row layout: W[e, n, :] = w[e, n, :] * scales[e, n]. config
    None: config_for's choice. Ids outside [0, num_experts) are not checked (that would wait
    on the device)."""
    scales = (gate_up_scales, down_scales)
    check_args(x, w_gate_up, w_down, topk_weights, topk_ids, activation, b_gate_up, b_down, scales)
    num_tokens, hidden = x.shape
    num_experts, inter = w_down.shape[0], w_down.shape[2]
    k = topk_ids.shape[1]
    if num_tokens == 0:
        return torch.empty_like(x)
    cfg = config or config_for(num_tokens, k, num_experts)
    sorted_pairs, tile_expert = align_by_expert(topk_ids, num_experts, cfg.block_m)
    num_rows, num_tiles, num_pairs = sorted_pairs.numel(), tile_expert.numel(), num_tokens * k
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 inputs: no tf32 rounding
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    blocks = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k}
    h = torch.empty(num_rows, inter, dtype=x.dtype, device=x.device)  # [rows, inter]
    _gate_up_kernel[(num_tiles, cdiv(inter, cfg.block_n))](
        x,
        w_gate_up,
        b_gate_up if b_gate_up is not None else x,
        gate_up_scales if gate_up_scales is not None else x,
        sorted_pairs,
        tile_expert,
        h,
        num_pairs,
        hidden,
        inter,
        TOPK=k,
        ACTIVATION=ACTIVATIONS.index(activation),
        LIMIT=SWIGLU_OAI_LIMIT,
        ALPHA=SWIGLU_OAI_ALPHA,
        HAS_BIAS=b_gate_up is not None,
        W_SCALED=gate_up_scales is not None,
        DOT_DTYPE=dot_dtype(x.dtype, _gate_up_kernel),
        PRECISION=precision,
        **blocks,
        **launch,
    )
    y = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)  # [num_pairs, hidden]
    _down_kernel[(num_tiles, cdiv(hidden, cfg.block_n))](
        h,
        w_down,
        b_down if b_down is not None else x,
        down_scales if down_scales is not None else x,
        sorted_pairs,
        tile_expert,
        topk_weights,
        y,
        num_pairs,
        hidden,
        inter,
        HAS_BIAS=b_down is not None,
        W_SCALED=down_scales is not None,
        DOT_DTYPE=dot_dtype(x.dtype, _down_kernel),
        PRECISION=precision,
        **blocks,
        **launch,
    )
    out = torch.empty_like(x)
    block = min(1024, max(16, 1 << (hidden - 1).bit_length()))
    _sum_slots_kernel[(num_tokens, cdiv(hidden, block))](y, out, hidden, TOPK=k, BLOCK=block)
    return out
