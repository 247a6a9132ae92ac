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
from engine.quant.weight_format import WeightQuant

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


RENORMALIZES: dict[RoutingRule, bool] = {
    softmax_topk: False,
    softmax_topk_renormalized: True,
    topk_softmax: True,
}
"""The rules engine/kernels/moe_route.py computes in one launch, and whether each divides the
picked weights by their sum (topk_softmax's softmax over the k picked logits is the same)."""


@cache
def _triton_route() -> Callable | None:
    """engine.kernels.moe_route.route_topk where Triton runs (CUDA), else None."""
    from engine.kernels import triton_available

    if not triton_available():
        return None
    from engine.kernels.moe_route import route_topk

    return route_topk


def pick_experts(
    router_logits: torch.Tensor,  # [num_tokens, num_experts]
    k: int,
    rule: RoutingRule,
    expert_scale: torch.Tensor | None = None,  # [num_experts]
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rule` over the logits, each picked weight times expert_scale[id] where given: one
    Triton launch on CUDA for the rules in RENORMALIZES, else the rule in PyTorch."""
    route = _triton_route() if router_logits.is_cuda else None
    if route is not None and rule in RENORMALIZES:
        return route(router_logits.contiguous(), k, RENORMALIZES[rule], expert_scale)
    weights, ids = rule(router_logits, k)
    if expert_scale is not None:
        weights = weights * expert_scale[ids].float()
    return weights, ids


@cache
def _triton_moe() -> Callable | None:
    """engine.kernels.moe.fused_moe where Triton runs (CUDA), else None."""
    from engine.kernels import triton_available

    if not triton_available():
        return None
    from engine.kernels.moe import fused_moe

    return fused_moe


def moe_kernel(x: torch.Tensor) -> Callable:
    """What runs the experts over `x`: the Triton fused_moe for CUDA tensors where Triton runs,
    else fused_moe_ref (same signature)."""
    fused_moe = _triton_moe() if x.is_cuda else None
    return fused_moe or fused_moe_ref


class MoEBlock(nn.Module):
    """A router (`gate`: Linear hidden -> num_experts) and num_experts gated MLPs stacked as
    `w_gate_up` [num_experts, 2 * inter, hidden] (the gate's rows first) and `w_down`
    [num_experts, hidden, inter], with optional biases `b_gate_up` and `b_down`. Each token
    runs through the k experts `routing` picks, weighted by their routing weights, and through
    the shared expert where there is one.

    quantize_experts turns the experts into int8 or int4 (engine/quant/weight_format.py's layouts,
    each expert's rows as one weight's): `w_gate_up` and `w_down` then hold the codes,
    `gate_up_scales` and `down_scales` the fp32 scales, `code` int4's table (buffers: a random
    draw of the model's parameters leaves them alone)."""

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
        shared_expert: nn.Module | None = None,
    ) -> None:
        """shared_expert: an MLP every token runs beside its routed experts, its output scaled
        by sigmoid(shared_expert_gate(x)) (a Linear hidden -> 1) and added (Qwen3.5-MoE)."""
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
        self.quant: WeightQuant | None = None
        """The experts' format once quantize_experts ran; None: in the activation dtype."""
        self.shared_expert = shared_expert
        self.shared_expert_gate = (
            nn.Linear(hidden_size, 1, bias=False) if shared_expert is not None else None
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_tokens, hidden] -> (topk_weights fp32, topk_ids), [num_tokens, k] each."""
        return pick_experts(self.gate(x), self.top_k, self.routing)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        return self.run_experts(x, *self.route(x))

    def run_experts(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        topk_weights: torch.Tensor,  # [num_tokens, k] fp32
        topk_ids: torch.Tensor,  # [num_tokens, k]
    ) -> torch.Tensor:  # [num_tokens, hidden]
        """The experts over x with routing already chosen (a family whose router reads another
        input than its experts calls this after its own route)."""
        kernel = moe_kernel(x)
        weights, quantized = (self.w_gate_up, self.w_down), {}
        if self.quant is not None and kernel is fused_moe_ref:
            weights = self.dequantized(x.dtype)
        elif self.quant is not None:  # the kernel reads the codes and scales
            quantized = dict(
                gate_up_scales=self.gate_up_scales,
                down_scales=self.down_scales,
                code=self.code,
                group_size=self.quant.group_size,
            )
        out = kernel(
            x,
            *weights,
            topk_weights,
            topk_ids,
            self.activation,
            self.b_gate_up,
            self.b_down,
            **quantized,
        )  # [num_tokens, hidden]
        if self.shared_expert is not None:
            gate = torch.sigmoid(self.shared_expert_gate(x))  # [num_tokens, 1]
            out = out + gate * self.shared_expert(x)
        return out

    @torch.no_grad()
    def quantize_experts(self, quant: WeightQuant) -> None:
        """Quantize the experts where they are, one expert's projection at a time (the 16-bit
        stacks are freed at the end)."""
        from engine.quant.bnb import code_table, quantize_4bit, quantize_int8

        def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if quant.kind == "int4":
                return quantize_4bit(w, quant.group_size, quant.quant_type)
            return quantize_int8(w)

        for name, scales in (("w_gate_up", "gate_up_scales"), ("w_down", "down_scales")):
            stack = getattr(self, name)  # [num_experts, rows, cols]
            parts = [quantize(stack[e]) for e in range(self.num_experts)]
            delattr(self, name)
            self.register_buffer(name, torch.stack([q for q, _ in parts]))
            self.register_buffer(scales, torch.stack([s for _, s in parts]))
        is_int4 = quant.kind == "int4"
        code = code_table(quant.quant_type).to(self.w_down.device) if is_int4 else None
        self.register_buffer("code", code, persistent=False)
        self.quant = quant

    def dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The quantized experts back in `dtype`: (w_gate_up, w_down) in the 16-bit layout
        (fused_moe_ref's input where the Triton kernel does not run)."""
        from engine.quant.reference import dequantize_to

        group = self.quant.group_size
        return tuple(
            torch.stack(
                [dequantize_to(q, s, self.code, group, dtype) for q, s in zip(codes, scales)]
            )
            for codes, scales in (
                (self.w_gate_up, self.gate_up_scales),
                (self.w_down, self.down_scales),
            )
        )
