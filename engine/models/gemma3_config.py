"""Gemma 3's config.json, read into ModelConfig's fields: the text model's defaults (published
configs leave most fields to them), the text part of a multimodal checkpoint's config, its
layer types and the RoPE of each layer type. Torch-free (the planner reads it)."""

from __future__ import annotations

from engine.models.config_fields import FULL, SLIDING

TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "eos_token_id": 1,
    "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}
"""transformers' Gemma3TextConfig defaults: a published config.json sets only what differs
(gemma-3-12b-it's text_config names 7 fields)."""


def text_config(raw: dict, defaults: dict = TEXT_DEFAULTS) -> dict:
    """A Gemma config.json as a flat text-model config with the `defaults` filled in (Gemma
    3's unless given): a multimodal checkpoint's `text_config` takes the top level's
    architecture, dtype, EOS ids and tied embeddings (its vision tower's weights are skipped
    at load)."""
    if "text_config" in raw:
        text = dict(raw["text_config"] or {})
        for key in ("architectures", "torch_dtype", "dtype", "eos_token_id"):
            if raw.get(key) is not None:
                text[key] = raw[key]
        text.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", True))
        raw = text
    return {**defaults, **{k: v for k, v in raw.items() if v is not None}}


def layer_types(raw: dict) -> tuple[str, ...]:
    """Per layer, sliding or full: `layer_types`, else every `sliding_window_pattern`-th layer
    is full (older configs)."""
    n = raw["num_hidden_layers"]
    types = raw.get("layer_types")
    if types is None:
        pattern = raw["sliding_window_pattern"]
        types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    if len(types) != n or set(types) - {SLIDING, FULL}:
        raise ValueError(
            f"layer_types must list {n} entries of {SLIDING!r} or {FULL!r}; got {types}"
        )
    return tuple(types)


def rope_by_layer_type(raw: dict) -> tuple[dict, dict]:
    """(full layers' RoPE parameters, sliding layers'), each with its `rope_theta`: from
    transformers 5's per-layer-type `rope_parameters`, or from `rope_theta` with `rope_scaling`
    (global layers) and `rope_local_base_freq` (sliding layers)."""
    params = raw.get("rope_parameters") or {}
    if FULL in params or SLIDING in params:
        full, local = dict(params.get(FULL) or {}), dict(params.get(SLIDING) or {})
    else:
        full, local = dict(raw.get("rope_scaling") or params), {}
    full.setdefault("rope_theta", raw["rope_theta"])
    local.setdefault("rope_theta", raw["rope_local_base_freq"])
    if local.get("rope_type", "default") != "default":
        raise ValueError(
            f"unsupported rope scaling {local['rope_type']!r} on the sliding layers; "
            "supported there: default"
        )
    return full, local


def gemma3_fields(raw: dict) -> dict:
    """ModelConfig fields that Gemma 3 sets its own way (`raw` from text_config)."""
    if raw.get("use_bidirectional_attention"):
        raise ValueError(
            "use_bidirectional_attention is set (an embedding model): the engine generates "
            "text with causal attention only"
        )
    full, local = rope_by_layer_type(raw)
    return {
        "rope_theta": float(full["rope_theta"]),
        "rope_local_theta": float(local["rope_theta"]),
        "layer_types": layer_types(raw),
        "qk_norm": True,
        "post_norms": True,
        "query_pre_attn_scalar": float(raw["query_pre_attn_scalar"]),
        "attn_logit_softcap": raw.get("attn_logit_softcapping"),
        "final_logit_softcap": raw.get("final_logit_softcapping"),
    }
