"""Gemma 4's mixture-of-experts block (gemma-4-26B-A4B): its router and its stacked GeGLU
experts between their own pre- and post-norms. The decoder layer runs it beside its dense MLP
on the same residual stream and adds the two outputs (engine/models/gemma4.py):
    post_feedforward_layernorm(post_feedforward_layernorm_1(mlp(...)) + Gemma4MoE(residual)).

The router reads the residual stream itself, not the experts' normed input:
    logits = proj(rms(x) * scale * hidden**-0.5)           (rms: an RMSNorm without weight)
    weights, ids = top-k of softmax(logits) in fp32, renormalised to sum to one
    weights = weights * per_expert_scale[ids]
Each expert is gelu_tanh(gate) * up then down, in MoEBlock's layout (gate rows first, as the
checkpoint's `experts.gate_up_proj` [E, 2I, H] holds them and transformers' Gemma4TextExperts
splits them), so MoEBlock's fused Triton kernel, its PyTorch reference and its int8 / int4
experts serve Gemma 4 unchanged. Gemma 4's norms scale by w (not 1 + w): our RMSNorm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.models.layers import RMSNorm
from engine.models.model_config import ModelConfig
from engine.models.moe_block import MoEBlock, pick_experts, softmax_topk_renormalized

CHECKPOINT_NAMES = {
    "router.proj.weight": "router.proj.weight",
    "router.scale": "router.scale",
    "router.per_expert_scale": "router.per_expert_scale",
    "experts.gate_up_proj": "w_gate_up",
    "experts.down_proj": "w_down",
    "pre_feedforward_layernorm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_feedforward_layernorm_2.weight": "post_feedforward_layernorm_2.weight",
}
"""A decoder layer's MoE weights in a Gemma 4 checkpoint (relative to `layers.L.`) -> their
parameter in Gemma4MoE."""


class Gemma4Router(nn.Module):
    """Router logits from the residual stream: a weightless RMSNorm, times `scale` [hidden]
    and hidden**-0.5, then `proj` (hidden -> num_experts). `per_expert_scale` [num_experts]
    multiplies the chosen experts' weights (Gemma4MoE.route)."""

    def __init__(self, hidden_size: int, num_experts: int, eps: float) -> None:
        super().__init__()
        self.eps, self.root = eps, hidden_size**-0.5
        self.proj = nn.Linear(hidden_size, num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, num_experts]
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return self.proj(h * self.scale * self.root)


class Gemma4MoE(MoEBlock):
    """The MoE half of a Gemma 4 decoder layer's feed-forward: x [T, hidden] (the residual
    stream after attention) -> post_feedforward_layernorm_2(experts(
    pre_feedforward_layernorm_2(x))) [T, hidden], routed by Gemma4Router on x. MoEBlock's
    `gate` is replaced by `router`."""

    def __init__(self, cfg: ModelConfig) -> None:
        if not cfg.num_experts or not cfg.num_experts_per_tok or not cfg.moe_intermediate_size:
            raise ValueError(
                "a Gemma 4 MoE layer needs num_experts, top_k_experts and "
                f"moe_intermediate_size in config.json; got {cfg.num_experts}, "
                f"{cfg.num_experts_per_tok}, {cfg.moe_intermediate_size}"
            )
        super().__init__(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            softmax_topk_renormalized,
            activation="gelu_tanh",
        )
        del self.gate
        self.router = Gemma4Router(cfg.hidden_size, cfg.num_experts, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm_2 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm_2 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, hidden] -> (topk_weights fp32, topk_ids), [T, k] each."""
        return pick_experts(self.router(x), self.top_k, self.routing, self.router.per_expert_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        experts_in = self.pre_feedforward_layernorm_2(x)
        return self.post_feedforward_layernorm_2(self.run_experts(experts_in, *self.route(x)))

    @torch.no_grad()
    def load_checkpoint_weight(
        self,
        name: str,
        tensor: torch.Tensor,
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    ) -> str:
        """Copy one checkpoint weight, named relative to its layer (a key of CHECKPOINT_NAMES),
        into its parameter; returns that parameter's name. An unknown name or a wrong shape is
        an error that names both."""
        ours = CHECKPOINT_NAMES.get(name)
        if ours is None:
            raise ValueError(
                f"unexpected Gemma 4 MoE weight {name!r}; expected one of "
                f"{', '.join(CHECKPOINT_NAMES)}"
            )
        param = self.get_parameter(ours)
        if param.shape != tensor.shape:
            raise ValueError(
                f"Gemma 4 MoE weight {name!r}: shape {tuple(tensor.shape)}, expected "
                f"{tuple(param.shape)} (hidden_size={self.router.proj.in_features}, "
                f"num_experts={self.num_experts}, moe_intermediate_size={self.intermediate_size})"
            )
        copy(param, tensor)
        return ours
