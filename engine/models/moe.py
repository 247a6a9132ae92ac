"""Mixture-of-experts layers: each family's routing rule and the MoE block (router, stacked
experts) that runs the fused Triton MoE kernel on CUDA and the PyTorch reference elsewhere.

Every routing rule maps router logits [num_tokens, num_experts] and k to
(topk_weights [num_tokens, k] fp32, topk_ids [num_tokens, k]): token t's output is
sum over j of topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) (engine/kernels/moe_ref.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
from torch import nn

from engine.kernels.moe_ref import ACTIVATIONS, fused_moe_ref

RoutingRule = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
"""(router_logits [num_tokens, num_experts], k) -> (topk_weights fp32, topk_ids), [T, k] each."""


def softmax_topk(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts, then the k largest probabilities, kept as they are (they sum
    to less than one). Qwen3-MoE and Qwen2-MoE with norm_topk_prob false."""
    probs = torch.softmax(router_logits.float(), dim=-1)  # [num_tokens, num_experts]
    return torch.topk(probs, k, dim=-1)


def softmax_topk_renormalized(
    router_logits: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts, the k largest, then divided by their sum so each token's k
    weights sum to one. Mixtral, and Qwen3-MoE with norm_topk_prob true (Qwen3-30B-A3B)."""
    weights, ids = softmax_topk(router_logits, k)
    return weights / weights.sum(dim=-1, keepdim=True), ids


def topk_softmax(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest raw router logits, then a softmax over those k only (gpt-oss). Equal to
    softmax_topk_renormalized in exact arithmetic; computed this way, as gpt-oss does."""
    logits, ids = torch.topk(router_logits.float(), k, dim=-1)  # [num_tokens, k]
    return torch.softmax(logits, dim=-1), ids


@cache
def _triton_moe() -> Callable | None:
    """engine.kernels.moe.fused_moe where Triton runs (CUDA), else None."""
    from engine.kernels import triton_available

    if not triton_available():
        return None
    from engine.kernels.moe import fused_moe

    return fused_moe


class MoEBlock(nn.Module):
    """A router (`gate`: Linear hidden -> num_experts) and num_experts gated MLPs stacked as
    `w_gate_up` [num_experts, 2 * inter, hidden] (the gate's rows first) and `w_down`
    [num_experts, hidden, inter], with optional biases `b_gate_up` and `b_down`. Each token
    runs through the k experts `routing` picks, weighted by their routing weights."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        routing: RoutingRule,
        activation: str = "silu",
        router_bias: bool = False,
        expert_bias: bool = False,
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(
                f"num_experts_per_tok={top_k} must be between 1 and num_experts={num_experts}"
            )
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown MoE activation {activation!r}; known: {', '.join(ACTIVATIONS)}"
            )
        self.num_experts, self.top_k = num_experts, top_k
        self.intermediate_size = intermediate_size
        self.routing, self.activation = routing, activation
        self.gate = nn.Linear(hidden_size, num_experts, bias=router_bias)
        self.w_gate_up = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w_down = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.b_gate_up = (
            nn.Parameter(torch.empty(num_experts, 2 * intermediate_size)) if expert_bias else None
        )
        self.b_down = nn.Parameter(torch.empty(num_experts, hidden_size)) if expert_bias else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_tokens, hidden] -> (topk_weights fp32, topk_ids), [num_tokens, k] each."""
        return self.routing(self.gate(x), self.top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        topk_weights, topk_ids = self.route(x)  # [num_tokens, k] each
        fused_moe = _triton_moe() if x.is_cuda else None
        run = fused_moe or fused_moe_ref
        return run(
            x,
            self.w_gate_up,
            self.w_down,
            topk_weights,
            topk_ids,
            self.activation,
            self.b_gate_up,
            self.b_down,
        )
