"""config.json fields of the mixture-of-experts families, read into ModelConfig's: Qwen3-MoE,
gpt-oss and Qwen3.5-MoE. Torch-free (the planner reads configs)."""

from __future__ import annotations

from engine.models.config_fields import FULL, SLIDING


def qwen3_moe_fields(raw: dict) -> dict:
    """Qwen3-MoE's expert fields. A layer keeps a dense MLP when it is in mlp_only_layers or
    when (layer + 1) is not a multiple of decoder_sparse_step; transformers' save_pretrained
    writes num_experts as num_local_experts."""
    num_experts = raw.get("num_experts", raw.get("num_local_experts"))
    k, inter = raw.get("num_experts_per_tok"), raw.get("moe_intermediate_size")
    if not num_experts or not k or not inter:
        raise ValueError(
            "a Qwen3MoeForCausalLM config.json needs num_experts (or num_local_experts), "
            f"num_experts_per_tok and moe_intermediate_size; got {num_experts}, {k}, {inter}"
        )
    if not 0 < k <= num_experts:
        raise ValueError(f"num_experts_per_tok={k} must be between 1 and num_experts={num_experts}")
    step = raw.get("decoder_sparse_step") or 1
    mlp_only = set(raw.get("mlp_only_layers") or ())
    layers = range(raw["num_hidden_layers"])
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=k,
        moe_intermediate_size=inter,
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        dense_layers=tuple(i for i in layers if i in mlp_only or (i + 1) % step != 0),
    )


def gpt_oss_fields(raw: dict) -> dict:
    """gpt-oss: every layer has experts of intermediate_size (num_local_experts, top
    num_experts_per_tok, which the original release calls experts_per_token), sinks in every
    layer, layer_types (by default sliding and full alternating, sliding first, as
    transformers' GptOssConfig sets them) over sliding_window, and the SwiGLU constants."""
    num_experts = raw.get("num_local_experts")
    k = raw.get("num_experts_per_tok", raw.get("experts_per_token"))
    if not num_experts or not k:
        raise ValueError(
            "a GptOssForCausalLM config.json needs num_local_experts and num_experts_per_tok "
            f"(or experts_per_token); got {num_experts}, {k}"
        )
    if not 0 < k <= num_experts:
        raise ValueError(f"num_experts_per_tok={k} must be between 1 and num_experts={num_experts}")
    n = raw["num_hidden_layers"]
    types = tuple(raw.get("layer_types") or (SLIDING if i % 2 == 0 else FULL for i in range(n)))
    if len(types) != n or not set(types) <= {SLIDING, FULL}:
        raise ValueError(
            f"layer_types must list {n} entries (num_hidden_layers), each {SLIDING!r} or "
            f"{FULL!r}; got {list(types)}"
        )
    if SLIDING in types and not raw.get("sliding_window"):
        raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=k,
        moe_intermediate_size=raw["intermediate_size"],
        attention_sinks=True,
        layer_types=types,
        swiglu=(raw.get("swiglu_alpha"), raw.get("swiglu_limit")),
    )


QWEN3_5_MOE_DEFAULTS = {
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
}
"""transformers' Qwen3_5MoeTextConfig defaults (Qwen3.5-35B-A3B's values) for the expert
fields a config.json may leave out."""


def qwen3_5_moe_fields(raw: dict) -> dict:
    """Qwen3.5-MoE's expert fields (`raw`: the text config): every layer has num_experts
    experts of moe_intermediate_size, num_experts_per_tok of them per token with their softmax
    weights renormalized to sum to one (transformers' Qwen3_5MoeTopKRouter always divides by
    their sum), and a shared expert of shared_expert_intermediate_size."""
    get = {k: raw.get(k) or default for k, default in QWEN3_5_MOE_DEFAULTS.items()}
    num_experts, k = get["num_experts"], get["num_experts_per_tok"]
    if not 0 < k <= num_experts:
        raise ValueError(f"num_experts_per_tok={k} must be between 1 and num_experts={num_experts}")
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=k,
        moe_intermediate_size=get["moe_intermediate_size"],
        shared_expert_intermediate_size=get["shared_expert_intermediate_size"],
        norm_topk_prob=True,
    )
