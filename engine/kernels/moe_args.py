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
# sm_90 by Triton 3.6 (as tests/support/moe_sm90_compile.py builds them, then ptxas -v) none
# spills: bf16 gate/up 64, 128, 128 registers a thread and 40, 72, 120 KiB shared memory, down
# 48, 72, 64 and 24, 48, 72 KiB; int4 gate/up at most 172 registers. benchmarks/kernels/bench_moe.py
# --configs times others.
DECODE = MoeConfig(16, 32, 128, 4, 3)
MEDIUM = MoeConfig(64, 64, 64, 4, 3)
PREFILL = MoeConfig(64, 128, 64, 8, 3)


def config_for(num_tokens: int, k: int, num_experts: int) -> MoeConfig:
    """The tile config for a call of this shape (by the mean pairs an expert)."""
    per_expert = num_tokens * k / num_experts
    return DECODE if per_expert <= 16 else MEDIUM if per_expert <= 128 else PREFILL


class QuantArgs(NamedTuple):
    """fused_moe's quantized-expert arguments (engine/quant/weight_format.py's layouts per
    expert)."""

    gate_up_scales: torch.Tensor | None
    down_scales: torch.Tensor | None
    code: torch.Tensor | None
    group_size: int


def check_args(
    x, w_gate_up, w_down, topk_weights, topk_ids, activation, b_gate_up, b_down, quant: QuantArgs
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
    int4 = w_down.dtype == torch.uint8
    quantized = w_down.dtype in (torch.int8, torch.uint8)
    num_tokens, hidden = x.shape
    experts, packed = w_down.shape[0], 2 if int4 else 1
    inter = w_down.shape[2] * packed
    want = {
        "w_gate_up": (experts, 2 * inter, hidden // packed),
        "w_down": (experts, hidden, inter // packed),
    }
    if tuple(w_gate_up.shape) != want["w_gate_up"] or tuple(w_down.shape) != want["w_down"]:
        raise ValueError(
            f"fused_moe: with x {tuple(x.shape)} and w_down {tuple(w_down.shape)} want w_gate_up "
            f"{want['w_gate_up']} and w_down {want['w_down']}; got {tuple(w_gate_up.shape)} "
            f"and {tuple(w_down.shape)} (gate rows, then up rows, per expert"
            f"{'; int4: two codes a byte' if int4 else ''})"
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
    named = {
        "x": (x, None, x.dtype),
        "w_gate_up": (w_gate_up, None, w_down.dtype if quantized else x.dtype),
        "w_down": (w_down, None, w_down.dtype if quantized else x.dtype),
        "topk_weights": (topk_weights, None, torch.float32),
        "topk_ids": (topk_ids, None, topk_ids.dtype),
        "b_gate_up": (b_gate_up, (experts, 2 * inter), x.dtype),
        "b_down": (b_down, (experts, hidden), x.dtype),
    }
    if quantized:
        group = quant.group_size
        if int4 and (group < 16 or group & (group - 1) or hidden % group or inter % group):
            raise ValueError(
                f"fused_moe: int4 group_size {group} must be a power of two >= 16 dividing "
                f"hidden {hidden} and inter {inter}"
            )
        groups = (hidden // group,), (inter // group,)
        gate_up_groups, down_groups = groups if int4 else ((), ())
        named["gate_up_scales"] = (
            quant.gate_up_scales,
            (experts, 2 * inter, *gate_up_groups),
            torch.float32,
        )
        named["down_scales"] = (quant.down_scales, (experts, hidden, *down_groups), torch.float32)
        if int4:
            named["code"] = (quant.code, (16,), torch.float32)
    elif quant.gate_up_scales is not None or quant.down_scales is not None:
        raise TypeError(
            f"fused_moe: scales given with {w_down.dtype} weights; quantized experts are int8 "
            "(or uint8 int4) weights"
        )
    for name, (t, shape, dtype) in named.items():
        if t is None:
            if name in ("gate_up_scales", "down_scales", "code"):
                raise ValueError(f"fused_moe: {w_down.dtype} experts need {name}")
            continue
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"fused_moe: {name} is {tuple(t.shape)}; want {shape}")
        if t.dtype != dtype:
            raise TypeError(
                f"fused_moe: {name} is {t.dtype}; want {dtype} (x is {x.dtype}; expert weights "
                "are x's dtype, or int8 / uint8 int4 with their scales, both alike)"
            )
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {name} must be contiguous (call .contiguous())")
        if t.device != x.device:
            raise ValueError(f"fused_moe: {name} is on {t.device} but x is on {x.device}")
