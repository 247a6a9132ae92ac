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
Quantized experts (engine/quant/weight_format.py's layouts) are read packed and widened in the K
loop (weight_tile): int8 exactly, its row scale multiplying the fp32 sum in the epilogue (a byte a
weight); int4 through the code table times the group's scale (half a byte a weight, plus the
scales).

A program reads its expert's weight rows once; with at most BLOCK_M pairs an expert (decode)
an expert is one tile, so each active expert's weights are read once a step and an expert with
no pair is never read. Nothing waits on the host: buffers have worst-case shapes known from the
input shapes, and tiles past the used rows exit at once, so a decode step can be captured in a
CUDA graph. Up to moe_gemv.MAX_TOKENS tokens (decode at small batches) skip the sort and the
slot sum: engine/kernels/moe_gemv.py reads each pair's expert directly, in two launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import moe_gemv
from engine.kernels.launch_math import cdiv
from engine.kernels.moe_align import align_by_expert
from engine.kernels.moe_args import MoeConfig, QuantArgs, check_args, config_for
from engine.kernels.moe_ref import ACTIVATIONS, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from engine.kernels.moe_tiles import act_and_mul, block_k_for, weight_tile
from engine.kernels.paged_args import dot_dtype


@triton.jit(do_not_specialize=["num_pairs"])
def _gate_up_kernel(
    x_ptr,  # [num_tokens, hidden]
    w_ptr,  # [num_experts, 2 * inter, hidden] (int4: hidden / 2 bytes a row)
    b_ptr,  # [num_experts, 2 * inter] (HAS_BIAS)
    s_ptr,  # fp32 scales: int8 [num_experts, 2 * inter], int4 [.., hidden / GROUP]
    code_ptr,  # [16] fp32 int4 table
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
    WKIND: tl.constexpr,
    GROUP: tl.constexpr,
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
    w_cols = hidden // 2 if WKIND == 2 else hidden  # stored columns a row
    g_index = expert.to(tl.int64) * 2 * inter + offs_n  # [BLOCK_N] gate rows (up: + inter)
    g_rows = w_ptr + g_index[:, None] * w_cols  # [BLOCK_N, 1]
    u_rows = g_rows + inter * w_cols
    g_scales = s_ptr + g_index * (hidden // GROUP)  # [BLOCK_N] (int4)
    u_scales = g_scales + inter * (hidden // GROUP)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x_mask = valid[:, None] & (offs_k[None, :] < hidden)
        x = tl.load(x_rows + offs_k[None, :], mask=x_mask, other=0.0).to(DOT_DTYPE)
        g = weight_tile(
            g_rows, g_scales, code_ptr, k0, hidden, n_mask, WKIND, GROUP, BLOCK_K, DOT_DTYPE
        )
        u = weight_tile(
            u_rows, u_scales, code_ptr, k0, hidden, n_mask, WKIND, GROUP, BLOCK_K, DOT_DTYPE
        )
        acc_g = tl.dot(x, tl.trans(g), acc_g, input_precision=PRECISION)
        acc_u = tl.dot(x, tl.trans(u), acc_u, input_precision=PRECISION)
    if WKIND == 1:  # int8: each output column times its row's scale
        acc_g *= tl.load(s_ptr + g_index, mask=n_mask, other=0.0)[None, :]
        acc_u *= tl.load(s_ptr + g_index + inter, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc_g += tl.load(b_ptr + g_index, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(b_ptr + g_index + inter, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    h = act_and_mul(acc_g, acc_u, ACTIVATION, LIMIT, ALPHA)
    out = h_ptr + rows.to(tl.int64)[:, None] * inter + offs_n[None, :]
    tl.store(out, h.to(h_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def _down_kernel(
    h_ptr,  # [rows, inter]
    w_ptr,  # [num_experts, hidden, inter] (int4: inter / 2 bytes a row)
    b_ptr,  # [num_experts, hidden] (HAS_BIAS)
    s_ptr,  # fp32 scales: int8 [num_experts, hidden], int4 [.., inter / GROUP]
    code_ptr,  # [16] fp32 int4 table
    sorted_ptr,  # [rows] int32
    tile_expert_ptr,  # [tiles] int32
    weights_ptr,  # [num_pairs] fp32 routing weights
    y_ptr,  # [num_pairs, hidden] out
    num_pairs,
    hidden,
    inter,
    HAS_BIAS: tl.constexpr,
    WKIND: tl.constexpr,
    GROUP: tl.constexpr,
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
    w_cols = inter // 2 if WKIND == 2 else inter
    w_index = expert.to(tl.int64) * hidden + offs_n  # [BLOCK_N]
    w_rows = w_ptr + w_index[:, None] * w_cols  # [BLOCK_N, 1]
    w_scales = s_ptr + w_index * (inter // GROUP)  # [BLOCK_N] (int4)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        h_mask = valid[:, None] & (offs_k[None, :] < inter)
        h = tl.load(h_rows + offs_k[None, :], mask=h_mask, other=0.0)
        w = weight_tile(
            w_rows, w_scales, code_ptr, k0, inter, n_mask, WKIND, GROUP, BLOCK_K, DOT_DTYPE
        )
        acc = tl.dot(h.to(DOT_DTYPE), tl.trans(w), acc, input_precision=PRECISION)
    if WKIND == 1:  # int8: each output column times its row's scale
        acc *= tl.load(s_ptr + w_index, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + w_index, mask=n_mask, other=0.0).to(tl.float32)[None, :]
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
    w_gate_up: torch.Tensor,  # [num_experts, 2 * inter, hidden] (int4: hidden / 2 bytes)
    w_down: torch.Tensor,  # [num_experts, hidden, inter] (int4: inter / 2 bytes)
    topk_weights: torch.Tensor,  # [num_tokens, k] fp32
    topk_ids: torch.Tensor,  # [num_tokens, k] int32 / int64, each in [0, num_experts)
    activation: str = "silu",
    b_gate_up: torch.Tensor | None = None,
    b_down: torch.Tensor | None = None,
    *,
    gate_up_scales: torch.Tensor | None = None,  # fp32 [num_experts, 2 * inter(, groups)]
    down_scales: torch.Tensor | None = None,  # fp32 [num_experts, hidden(, groups)]
    code: torch.Tensor | None = None,  # fp32 [16] (int4)
    group_size: int = 64,  # int4
    config: MoeConfig | None = None,
) -> torch.Tensor:  # [num_tokens, hidden]
    """fused_moe_ref's result (module docstring says how), the experts' weights in x's dtype or
    quantized in engine/quant/weight_format.py's layouts, each expert's rows as one weight's: int8
    with fp32 row scales [.., rows], or int4 (uint8, two codes a byte) with fp32 group scales
    [.., rows, cols / group_size] and the [16] code table. config None: config_for's choice,
    or for up to moe_gemv.MAX_TOKENS tokens moe_gemv's two launches with no sort.
    Ids outside [0, num_experts) are not checked (that would wait on the device)."""
    quant = QuantArgs(gate_up_scales, down_scales, code, group_size)
    check_args(x, w_gate_up, w_down, topk_weights, topk_ids, activation, b_gate_up, b_down, quant)
    num_tokens, hidden = x.shape
    wkind = {torch.int8: 1, torch.uint8: 2}.get(w_down.dtype, 0)
    num_experts, inter = w_down.shape[0], w_down.shape[2] * (2 if wkind == 2 else 1)
    k = topk_ids.shape[1]
    if num_tokens == 0:
        return torch.empty_like(x)
    if config is None and num_tokens <= moe_gemv.MAX_TOKENS:
        return moe_gemv.fused_moe_pairs(
            x, w_gate_up, w_down, topk_weights, topk_ids, activation, b_gate_up, b_down,
            gate_up_scales, down_scales, code, group_size,
        )  # fmt: skip
    cfg = config or config_for(num_tokens, k, num_experts)
    sorted_pairs, tile_expert = align_by_expert(topk_ids, num_experts, cfg.block_m)
    num_rows, num_tiles, num_pairs = sorted_pairs.numel(), tile_expert.numel(), num_tokens * k
    group = group_size if wkind == 2 else 1
    common = {
        "WKIND": wkind,
        "GROUP": group,
        "PRECISION": "ieee" if x.dtype == torch.float32 else "tf32",  # fp32: no tf32 rounding
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
    }
    h = torch.empty(num_rows, inter, dtype=x.dtype, device=x.device)  # [rows, inter]
    _gate_up_kernel[(num_tiles, cdiv(inter, cfg.block_n))](
        x,
        w_gate_up,
        b_gate_up if b_gate_up is not None else x,
        gate_up_scales if gate_up_scales is not None else x,
        code if code is not None else x,
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
        DOT_DTYPE=dot_dtype(x.dtype, _gate_up_kernel),
        BLOCK_K=block_k_for(cfg.block_k, hidden, wkind, group),
        **common,
    )
    y = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)  # [num_pairs, hidden]
    _down_kernel[(num_tiles, cdiv(hidden, cfg.block_n))](
        h,
        w_down,
        b_down if b_down is not None else x,
        down_scales if down_scales is not None else x,
        code if code is not None else x,
        sorted_pairs,
        tile_expert,
        topk_weights,
        y,
        num_pairs,
        hidden,
        inter,
        HAS_BIAS=b_down is not None,
        DOT_DTYPE=dot_dtype(x.dtype, _down_kernel),
        BLOCK_K=block_k_for(cfg.block_k, inter, wkind, group),
        **common,
    )
    out = torch.empty_like(x)
    block = min(1024, max(16, 1 << (hidden - 1).bit_length()))
    _sum_slots_kernel[(num_tokens, cdiv(hidden, block))](y, out, hidden, TOPK=k, BLOCK=block)
    return out
