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

A program reads its expert's weight rows once; with at most BLOCK_M pairs an expert (decode)
an expert is one tile, so each active expert's weights are read once a step and an expert with
no pair is never read. Nothing waits on the host: buffers have worst-case shapes known from the
input shapes, and tiles past the used rows exit at once, so a decode step can be captured in a
CUDA graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from engine.kernels.launch_math import cdiv
from engine.kernels.moe_align import align_by_expert
from engine.kernels.moe_ref import ACTIVATIONS, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from engine.kernels.paged_args import dot_dtype


class MoeConfig(NamedTuple):
    """Tile sizes of both GEMMs: BLOCK_M sorted rows, BLOCK_N output columns, BLOCK_K a step."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# Chosen by the mean pairs an expert (num_tokens * k / num_experts): up to 16 (decode, and
# Qwen3-30B-A3B's 128 experts up to 256 tokens) one 16-row tile an expert and narrow N tiles,
# so the few active experts still fill the SMs (a batch-1 Qwen3-30B-A3B step: 8 experts x
# 768 / 32 = 192 gate/up programs); more (prefill) wide tiles for tensor-core reuse. Built for
# sm_90 by Triton 3.6 (tests/support/moe_sm90_compile.py, ptxas -v) none spills: gate/up 64,
# 128, 128 registers a thread and 40, 72, 120 KiB shared memory, down 48, 78, 64 and 24, 48,
# 72 KiB. scripts/bench_moe.py --configs times others.
DECODE = MoeConfig(16, 32, 128, 4, 3)
MEDIUM = MoeConfig(64, 64, 64, 4, 3)
PREFILL = MoeConfig(64, 128, 64, 8, 3)


def config_for(num_tokens: int, k: int, num_experts: int) -> MoeConfig:
    """The tile config for a call of this shape (by the mean pairs an expert)."""
    per_expert = num_tokens * k / num_experts
    return DECODE if per_expert <= 16 else MEDIUM if per_expert <= 128 else PREFILL


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
        g = tl.load(g_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask, other=0.0)
        u = tl.load(u_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask, other=0.0)
        x, g, u = x.to(DOT_DTYPE), g.to(DOT_DTYPE), u.to(DOT_DTYPE)
        acc_g = tl.dot(x, tl.trans(g), acc_g, input_precision=PRECISION)
        acc_u = tl.dot(x, tl.trans(u), acc_u, input_precision=PRECISION)
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
    sorted_ptr,  # [rows] int32
    tile_expert_ptr,  # [tiles] int32
    weights_ptr,  # [num_pairs] fp32 routing weights
    y_ptr,  # [num_pairs, hidden] out
    num_pairs,
    hidden,
    inter,
    HAS_BIAS: tl.constexpr,
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
        w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask, other=0.0)
        acc = tl.dot(h.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc, input_precision=PRECISION)
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
    config: MoeConfig | None = None,
) -> torch.Tensor:  # [num_tokens, hidden]
    """fused_moe_ref's result (module docstring says how); config None: config_for's choice.
    Ids outside [0, num_experts) are not checked (that would wait on the device)."""
    _check(x, w_gate_up, w_down, topk_weights, topk_ids, activation, b_gate_up, b_down)
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
        b_gate_up if b_gate_up is not None else w_gate_up,
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
        PRECISION=precision,
        **blocks,
        **launch,
    )
    y = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)  # [num_pairs, hidden]
    _down_kernel[(num_tiles, cdiv(hidden, cfg.block_n))](
        h,
        w_down,
        b_down if b_down is not None else w_down,
        sorted_pairs,
        tile_expert,
        topk_weights,
        y,
        num_pairs,
        hidden,
        inter,
        HAS_BIAS=b_down is not None,
        DOT_DTYPE=dot_dtype(x.dtype, _down_kernel),
        PRECISION=precision,
        **blocks,
        **launch,
    )
    out = torch.empty_like(x)
    block = min(1024, max(16, 1 << (hidden - 1).bit_length()))
    _sum_slots_kernel[(num_tokens, cdiv(hidden, block))](y, out, hidden, TOPK=k, BLOCK=block)
    return out


def _check(x, w_gate_up, w_down, topk_weights, topk_ids, activation, b_gate_up, b_down) -> None:
    """Clear errors for calls the kernels would get wrong: dtypes, shapes, contiguity, device."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown MoE activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"fused_moe: x is {x.dtype}; pass float16, bfloat16 or float32")
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError(
            "fused_moe: want x [num_tokens, hidden], w_gate_up [experts, 2 * inter, hidden], "
            f"w_down [experts, hidden, inter]; got {tuple(x.shape)}, {tuple(w_gate_up.shape)}, "
            f"{tuple(w_down.shape)}"
        )
    num_tokens, hidden = x.shape
    experts, _, inter = w_down.shape
    if tuple(w_gate_up.shape) != (experts, 2 * inter, hidden) or w_down.shape[1] != hidden:
        raise ValueError(
            f"fused_moe: with x {tuple(x.shape)} and w_down {tuple(w_down.shape)} want w_gate_up "
            f"{(experts, 2 * inter, hidden)} and w_down {(experts, hidden, inter)}; got "
            f"{tuple(w_gate_up.shape)} (gate rows, then up rows, per expert)"
        )
    if (
        topk_ids.dim() != 2
        or topk_ids.shape[0] != num_tokens
        or topk_ids.shape != topk_weights.shape
    ):
        raise ValueError(
            f"fused_moe: topk_ids {tuple(topk_ids.shape)} and topk_weights "
            f"{tuple(topk_weights.shape)} must both be [num_tokens={num_tokens}, k]"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64) or topk_weights.dtype != torch.float32:
        raise TypeError(
            f"fused_moe: want int32 / int64 topk_ids and float32 topk_weights; got "
            f"{topk_ids.dtype} and {topk_weights.dtype}"
        )
    biases = {"b_gate_up": (b_gate_up, (experts, 2 * inter)), "b_down": (b_down, (experts, hidden))}
    named = {"x": x, "w_gate_up": w_gate_up, "w_down": w_down, "topk_weights": topk_weights}
    named |= {"topk_ids": topk_ids}
    for name, (bias, shape) in biases.items():
        if bias is not None:
            if tuple(bias.shape) != shape:
                raise ValueError(f"fused_moe: {name} is {tuple(bias.shape)}; want {shape}")
            named[name] = bias
    for name, t in named.items():
        if name in ("w_gate_up", "w_down", "b_gate_up", "b_down") and t.dtype != x.dtype:
            raise TypeError(f"fused_moe: {name} is {t.dtype} but x is {x.dtype}; cast one")
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {name} must be contiguous (call .contiguous())")
        if t.device != x.device:
            raise ValueError(f"fused_moe: {name} is on {t.device} but x is on {x.device}")
