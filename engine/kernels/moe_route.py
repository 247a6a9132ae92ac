"""MoE routing in one launch: router logits [num_tokens, num_experts] -> each token's k experts
and their fp32 weights, in place of PyTorch's softmax, top-k and renormalisation (four or five
launches a layer at decode). The rules are engine/models/moe_block.py's:

- renormalize false (softmax_topk): weight = softmax over all experts at the picked ones;
- renormalize true (softmax_topk_renormalized, topk_softmax): the k picked weights divided by
  their sum, which equals a softmax over the k picked logits.

Experts are picked by the largest logit (the softmax keeps the order), in descending order as
torch.topk gives them; among equal logits the lowest expert index first. `expert_scale`
[num_experts] (Gemma 4's per-expert scale) multiplies each picked weight last.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import pdl
from engine.kernels.launch_math import next_power_of_2


@triton.jit
def _route_kernel(
    logits_ptr,  # [num_tokens, num_experts]
    scale_ptr,  # [num_experts] (HAS_SCALE)
    weights_ptr,  # [num_tokens, TOPK] fp32 out
    ids_ptr,  # [num_tokens, TOPK] int32 out
    num_experts,
    TOPK: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)  # engine/kernels/pdl.py
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    in_range = experts < num_experts
    logits = tl.load(logits_ptr + token * num_experts + experts, mask=in_range, other=0.0)
    logits = tl.where(in_range, logits.to(tl.float32), float("-inf"))  # [BLOCK_E]
    top = tl.max(logits, axis=0)
    total = tl.sum(tl.where(in_range, tl.exp(logits - top), 0.0), axis=0)
    slots = tl.arange(0, BLOCK_K)
    picked_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    picked = tl.zeros([BLOCK_K], dtype=tl.float32)  # exp(logit - top) of each pick
    left = logits
    for j in tl.static_range(TOPK):
        best = tl.max(left, axis=0)
        expert = tl.min(tl.where(left == best, experts, BLOCK_E), axis=0)  # lowest index
        picked_ids = tl.where(slots == j, expert, picked_ids)
        picked = tl.where(slots == j, tl.exp(best - top), picked)
        left = tl.where(experts == expert, float("-inf"), left)
    if RENORMALIZE:
        weights = picked / tl.sum(picked, axis=0)  # slots past TOPK hold 0
    else:
        weights = picked / total
    used = slots < TOPK
    if HAS_SCALE:
        weights *= tl.load(scale_ptr + picked_ids, mask=used, other=0.0).to(tl.float32)
    tl.store(weights_ptr + token * TOPK + slots, weights, mask=used)
    tl.store(ids_ptr + token * TOPK + slots, picked_ids, mask=used)


def route_topk(
    logits: torch.Tensor,  # [num_tokens, num_experts]
    k: int,
    renormalize: bool,
    expert_scale: torch.Tensor | None = None,  # [num_experts]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights fp32, topk_ids int32), [num_tokens, k] each, as the module docstring
    says. One program a token."""
    if logits.dim() != 2 or not logits.is_contiguous():
        raise ValueError(
            f"route_topk: want contiguous logits [num_tokens, num_experts]; got "
            f"{tuple(logits.shape)}"
        )
    num_tokens, num_experts = logits.shape
    if not 0 < k <= num_experts:
        raise ValueError(f"route_topk: k={k} must be between 1 and num_experts={num_experts}")
    if expert_scale is not None and tuple(expert_scale.shape) != (num_experts,):
        raise ValueError(
            f"route_topk: expert_scale is {tuple(expert_scale.shape)}; want ({num_experts},)"
        )
    weights = torch.empty(num_tokens, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, k, dtype=torch.int32, device=logits.device)
    if num_tokens == 0:
        return weights, ids
    use_pdl = pdl.enabled(logits)  # one token: batch-1 decode
    _route_kernel[(num_tokens,)](
        logits,
        expert_scale if expert_scale is not None else logits,
        weights,
        ids,
        num_experts,
        TOPK=k,
        RENORMALIZE=renormalize,
        HAS_SCALE=expert_scale is not None,
        BLOCK_E=max(16, next_power_of_2(num_experts)),
        BLOCK_K=max(2, next_power_of_2(k)),
        PDL=use_pdl,
        num_warps=1 if num_experts <= 128 else 4,
        launch_pdl=use_pdl,
    )
    return weights, ids
