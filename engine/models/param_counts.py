"""Parameter counts by kind (ParamCounts): what the planner's weight bytes and speed floor read,
from a ModelConfig's per-layer description. Torch-free. ModelConfig.param_counts() calls this
module, so it takes the config untyped rather than import engine/models/model_config.py back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.models.gemma4_config import per_layer_input_params
from engine.models.linear_attention import LINEAR


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameters by kind (the planner's weight bytes and speed floor read these)."""

    linear: int
    """Every quantizable projection's weights (attention, MLP or experts); all experts."""
    linear_rows: int
    """Output rows of those projections (int8 keeps one scale per row)."""
    embed: int
    """Embedding table plus LM head (one table when tied)."""
    other: int
    """Norms, routers, biases and sinks: kept in the activation dtype."""
    active_linear: int
    """The projections one token reads: with experts, only num_experts_per_tok of them."""
    experts: int = 0
    """The experts' projection weights, every MoE layer (part of `linear`)."""
    expert_rows: int = 0
    """Output rows of those (part of `linear_rows`)."""

    @property
    def total(self) -> int:
        return self.linear + self.embed + self.other

    @property
    def active(self) -> int:
        return self.active_linear + self.embed + self.other


def count_params(cfg: Any) -> ParamCounts:
    """Parameters by kind: attention (per layer's shape; K/V-sharing layers: no k/v, no k
    norm; k_eq_v: no v), dense MLPs (mlp_size) and/or experts, norms, routers, per-layer
    inputs (gemma4_config.per_layer_input_params)."""
    h, v = cfg.hidden_size, cfg.vocab_size
    linear = rows = active = other = experts = expert_rows = 0
    for i in range(cfg.num_layers):
        if cfg.layer_type(i) == LINEAR:
            mix, mix_rows, mix_other = linear_attention_params(cfg)
            linear, rows, active = linear + mix, rows + mix_rows, active + mix
            other += mix_other + 2 * h
        else:
            att = cfg.layer_attention(i)
            shared = att.kv_shared_from is not None
            q = cfg.num_heads * att.head_dim
            kv = 0 if shared else att.num_kv_heads * att.head_dim
            kv *= 1 if att.k_eq_v else 2  # K and V, or K alone
            q_rows = 2 * q if cfg.attn_output_gate else q  # the gate comes with q
            attn = h * (q_rows + kv) + q * h
            linear, rows, active = linear + attn, rows + q_rows + kv + h, active + attn
            other += (4 if cfg.post_norms else 2) * h + (cfg.num_heads if att.sinks else 0)
            other += (1 if shared else 2) * att.head_dim if cfg.qk_norm else 0
        if cfg.is_moe_layer(i):
            e, k, mi = cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
            linear, rows = linear + e * 3 * h * mi, rows + e * (2 * mi + h)
            experts, expert_rows = experts + e * 3 * h * mi, expert_rows + e * (2 * mi + h)
            active += k * 3 * h * mi
            other += h * e  # the router
            other += 3 * h + h + e if cfg.moe_beside_mlp else 0  # norms, router scales
            si = cfg.shared_expert_intermediate_size
            if si:  # the shared expert runs for every token; its gate is one row
                linear, rows, active = linear + 3 * h * si, rows + 2 * si + h, active + 3 * h * si
                other += h
        if not cfg.is_moe_layer(i) or cfg.moe_beside_mlp:
            mi = cfg.mlp_size(i)
            linear, rows, active = linear + 3 * h * mi, rows + 2 * mi + h, active + 3 * h * mi
    embed = v * h * (1 if cfg.tie_word_embeddings else 2)
    if cfg.hidden_size_per_layer_input:
        ple_embed, ple_other = per_layer_input_params(cfg)
        embed, other = embed + ple_embed, other + ple_other
    return ParamCounts(linear, rows, embed, other + h, active, experts, expert_rows)


def linear_attention_params(cfg: Any) -> tuple[int, int, int]:
    """One LINEAR layer's (projection weights, their output rows, other parameters): the
    q/k/v, z (output gate), b (beta) and a (decay) input projections and out_proj; the
    conv1d taps, A_log, dt_bias and the gated norm's weight."""
    shape, h = cfg.linear_attention, cfg.hidden_size
    if shape is None:
        raise ValueError("a config with linear_attention layers needs their shape")
    hv = shape.num_value_heads
    in_rows = shape.conv_dim + shape.value_dim + 2 * hv
    weights = h * in_rows + shape.value_dim * h
    other = shape.conv_dim * shape.conv_kernel + 2 * hv + shape.value_head_dim
    return weights, in_rows + h, other
