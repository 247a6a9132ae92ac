"""What a fused_moe call (engine/kernels/moe.py) takes: its tile configs by shape and the checks
of its arguments, with errors that say what to change."""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.kernels.moe_ref import ACTIVATIONS


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


def check_args(
    x, w_gate_up, w_down, topk_weights, topk_ids, activation, b_gate_up, b_down, scales
) -> None:
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
    gate_up_scales, down_scales = scales
    int8 = gate_up_scales is not None or down_scales is not None
    extra = {
        "b_gate_up": (b_gate_up, (experts, 2 * inter), x.dtype),
        "b_down": (b_down, (experts, hidden), x.dtype),
        "gate_up_scales": (gate_up_scales, (experts, 2 * inter), torch.float32),
        "down_scales": (down_scales, (experts, hidden), torch.float32),
    }
    weight_dtype = torch.int8 if int8 else x.dtype
    named = {"x": (x, x.dtype), "w_gate_up": (w_gate_up, weight_dtype)}
    named |= {"w_down": (w_down, weight_dtype), "topk_weights": (topk_weights, torch.float32)}
    named |= {"topk_ids": (topk_ids, topk_ids.dtype)}
    if int8 and (gate_up_scales is None or down_scales is None):
        raise ValueError("fused_moe: int8 experts need both gate_up_scales and down_scales")
    for name, (t, shape, dtype) in extra.items():
        if t is not None:
            if tuple(t.shape) != shape:
                raise ValueError(f"fused_moe: {name} is {tuple(t.shape)}; want {shape}")
            named[name] = (t, dtype)
    for name, (t, dtype) in named.items():
        if t.dtype != dtype:
            raise TypeError(
                f"fused_moe: {name} is {t.dtype}; want {dtype} (x is {x.dtype}; weights are "
                "x's dtype, or int8 with gate_up_scales and down_scales)"
            )
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {name} must be contiguous (call .contiguous())")
        if t.device != x.device:
            raise ValueError(f"fused_moe: {name} is on {t.device} but x is on {x.device}")
