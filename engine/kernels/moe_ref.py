"""Pure-PyTorch mixture of experts: the CPU path and the reference the Triton MoE kernel is
tested against.

Layout (shared by every MoE kernel): per layer, the experts' gate and up projections stacked
as `w_gate_up` [num_experts, 2 * inter, hidden] (the gate's rows first, then the up's) and the
down projections as `w_down` [num_experts, hidden, inter]; optional biases `b_gate_up`
[num_experts, 2 * inter] and `b_down` [num_experts, hidden]. Routing has already chosen
`topk_ids` [num_tokens, k] and their weights `topk_weights` [num_tokens, k] (fp32): the output
is sum over j of topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_oai")
"""How an expert's gate and up halves combine: silu(gate) * up (Qwen3-MoE, Mixtral),
gelu_tanh(gate) * up (Gemma), and gpt-oss's clamped SwiGLU (act_and_mul says how)."""
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0
"""gpt-oss's SwiGLU constants (its config's swiglu_limit; alpha is fixed in its code)."""


def act_and_mul(h: torch.Tensor, activation: str, limit: float = SWIGLU_OAI_LIMIT) -> torch.Tensor:
    """[n, 2 * inter] (gate, up) -> [n, inter]."""
    gate, up = h.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    if activation == "swiglu_oai":
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
        return (up + 1) * (gate * torch.sigmoid(gate * SWIGLU_OAI_ALPHA))
    raise ValueError(f"unknown MoE activation {activation!r}; known: {', '.join(ACTIVATIONS)}")


def fused_moe_ref(
    x: torch.Tensor,  # [num_tokens, hidden]
    w_gate_up: torch.Tensor,  # [num_experts, 2 * inter, hidden]
    w_down: torch.Tensor,  # [num_experts, hidden, inter]
    topk_weights: torch.Tensor,  # [num_tokens, k]
    topk_ids: torch.Tensor,  # [num_tokens, k]
    activation: str = "silu",
    b_gate_up: torch.Tensor | None = None,
    b_down: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, hidden]
    """Each expert runs once over the tokens routed to it; outputs are summed in fp32 with
    their routing weights, then cast to x's dtype."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    flat_weights = topk_weights.reshape(-1).float()
    k = topk_ids.shape[1]
    for expert in torch.unique(flat_ids).tolist():
        slots = (flat_ids == expert).nonzero().squeeze(1)
        tokens = slots // k
        h = F.linear(x[tokens], w_gate_up[expert], None if b_gate_up is None else b_gate_up[expert])
        y = F.linear(
            act_and_mul(h, activation), w_down[expert], None if b_down is None else b_down[expert]
        )
        out.index_add_(0, tokens, y.float() * flat_weights[slots, None])
    return out.to(x.dtype)
