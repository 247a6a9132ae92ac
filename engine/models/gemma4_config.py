"""Gemma 4's config.json, read into ModelConfig's fields: the text model's defaults (published
configs leave many fields to them), the text part of a multimodal checkpoint's config, its
layer types, the RoPE of each layer type, the full layers' own head dim and KV heads, K/V
sharing, per-layer inputs and the MoE block. Torch-free (the planner reads it).

As transformers 5.24's Gemma4TextConfig builds them:
- layer types: every sixth layer full unless `layer_types` is given; the last layer is always
  full (transformers forces it, with a warning);
- RoPE: sliding layers plain RoPE of base 1e4, full layers "proportional" RoPE (a quarter of
  the head's frequencies rotate) of base 1e6, unless `rope_parameters` says otherwise;
- full layers: head dim `global_head_dim` (512 unless given) and, where `attention_k_eq_v`
  (transformers gates it so), `num_global_key_value_heads` KV heads; or both from a saved
  config's `per_layer_config` (layer index -> head_dim, num_key_value_heads);
- attention scores are not scaled (transformers' scaling = 1.0): query_pre_attn_scalar = 1.
"""

from __future__ import annotations

from engine.models import gemma3_config
from engine.models.config_fields import FULL, SLIDING, rope_scaling_from

TEXT_DEFAULTS = {
    "vocab_size": 262_144,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "global_head_dim": 512,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "eos_token_id": 1,
    "tie_word_embeddings": True,
    "sliding_window": 512,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
}
"""transformers' Gemma4TextConfig defaults (global_head_dim: the keyword its __post_init__
takes)."""

DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
"""Gemma4TextConfig's rope_parameters when config.json has none."""

_NULL_MEANS_NONE = ("hidden_size_per_layer_input",)
"""Fields whose explicit null turns the feature off (rather than taking the default)."""


def text_config(raw: dict) -> dict:
    """A Gemma 4 config.json as a flat text-model config with the defaults filled in (a
    Gemma4ForConditionalGeneration's `text_config`, as for Gemma 3)."""
    text = (raw.get("text_config") or {}) if "text_config" in raw else raw
    flat = gemma3_config.text_config(raw, TEXT_DEFAULTS)
    for key in _NULL_MEANS_NONE:
        if key in text and text[key] is None:
            flat[key] = 0
    return flat


def layer_types(raw: dict) -> tuple[str, ...]:
    """Per layer, sliding or full: `layer_types`, else every sixth layer full; the last
    layer full in any case."""
    n = raw["num_hidden_layers"]
    types = list(
        raw.get("layer_types") or (FULL if (i + 1) % 6 == 0 else SLIDING for i in range(n))
    )
    if len(types) != n or set(types) - {SLIDING, FULL}:
        raise ValueError(
            f"layer_types must list {n} entries (num_hidden_layers) of {SLIDING!r} or {FULL!r}; "
            f"got {types}"
        )
    types[-1] = FULL
    return tuple(types)


def rope_by_layer_type(raw: dict) -> tuple[dict, dict]:
    """(full layers' RoPE parameters, sliding layers'), each with its rope_type and
    rope_theta, from `rope_parameters` or the defaults."""
    params = raw.get("rope_parameters") or DEFAULT_ROPE
    if not isinstance(params.get(FULL), dict) or not isinstance(params.get(SLIDING), dict):
        raise ValueError(
            f"a Gemma 4 config's rope_parameters needs a {FULL!r} and a {SLIDING!r} entry; "
            f"got {params}"
        )
    full = {"rope_type": "default", **params[FULL]}
    local = {"rope_type": "default", **params[SLIDING]}
    if local["rope_type"] != "default":
        raise ValueError(
            f"unsupported rope scaling {local['rope_type']!r} on the sliding layers; "
            "supported there: default"
        )
    for kind, p in ((FULL, full), (SLIDING, local)):
        if p.get("rope_theta") is None:
            raise ValueError(f"rope_parameters[{kind!r}] needs rope_theta")
    return full, local


def global_attention(raw: dict, types: tuple[str, ...]) -> tuple[int, int]:
    """The full layers' (head dim, KV heads): from `per_layer_config` (which must set the same
    on every full layer and nothing on the sliding ones), else global_head_dim and, where
    attention_k_eq_v, num_global_key_value_heads."""
    head_dim, kv_heads = raw["head_dim"], raw["num_key_value_heads"]
    per_layer = raw.get("per_layer_config")
    if per_layer is None:
        global_kv = raw.get("num_global_key_value_heads") if raw["attention_k_eq_v"] else None
        return raw["global_head_dim"], global_kv or kv_heads
    overrides = {}
    for key, value in per_layer.items():
        if not str(key).isdigit() or int(key) >= len(types) or not isinstance(value, dict):
            raise ValueError(
                f"per_layer_config maps layer indices below {len(types)} to dicts; got {key!r}"
            )
        unknown = set(value) - {"head_dim", "num_key_value_heads"}
        if unknown:
            raise ValueError(
                f"per_layer_config[{key!r}] sets {sorted(unknown)}; the engine reads only "
                "head_dim and num_key_value_heads there"
            )
        overrides[int(key)] = (
            value.get("head_dim", head_dim),
            value.get("num_key_value_heads", kv_heads),
        )
    per_type = {
        kind: {overrides.get(i, (head_dim, kv_heads)) for i, t in enumerate(types) if t == kind}
        for kind in (SLIDING, FULL)
    }
    if per_type[SLIDING] - {(head_dim, kv_heads)} or len(per_type[FULL]) != 1:
        raise ValueError(
            "per_layer_config must give every full_attention layer the same head_dim and "
            "num_key_value_heads and leave the sliding layers to head_dim and "
            f"num_key_value_heads; got {per_layer}"
        )
    return next(iter(per_type[FULL]))


def gemma4_fields(raw: dict) -> dict:
    """ModelConfig fields that Gemma 4 sets its own way (`raw` from text_config)."""
    if raw.get("use_bidirectional_attention") == "all":
        raise ValueError(
            "use_bidirectional_attention is 'all' (an embedding model): the engine generates "
            "text with causal attention only"
        )  # "vision" makes image tokens attend both ways: text prompts have none
    types = layer_types(raw)
    full, local = rope_by_layer_type(raw)
    global_head_dim, global_kv_heads = global_attention(raw, types)
    n, shared = raw["num_hidden_layers"], raw["num_kv_shared_layers"] or 0
    if not 0 <= shared < n:
        raise ValueError(f"num_kv_shared_layers={shared} must be below num_hidden_layers={n}")
    per_layer_input = raw["hidden_size_per_layer_input"] or 0
    fields = {
        "layer_types": types,
        "rope_theta": float(full["rope_theta"]),
        "rope_scaling": rope_scaling_from(full),
        "rope_local_theta": float(local["rope_theta"]),
        "partial_rotary_factor": 1.0,  # proportional RoPE: its factor is in rope_scaling
        "qk_norm": True,
        "post_norms": True,
        "query_pre_attn_scalar": 1.0,
        "final_logit_softcap": raw.get("final_logit_softcapping"),
        "global_head_dim": global_head_dim,
        "global_kv_heads": global_kv_heads,
        "k_eq_v_global": bool(raw["attention_k_eq_v"]),
        "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": per_layer_input,
        "vocab_size_per_layer_input": raw["vocab_size_per_layer_input"] if per_layer_input else 0,
        "use_double_wide_mlp": bool(raw["use_double_wide_mlp"]),
    }
    if raw["enable_moe_block"]:
        fields.update(_moe_fields(raw))
    return fields


def _moe_fields(raw: dict) -> dict:
    """enable_moe_block: every layer runs num_experts experts (top_k_experts of them, weights
    renormalised) of moe_intermediate_size beside its dense MLP."""
    e, k, inter = raw.get("num_experts"), raw.get("top_k_experts"), raw.get("moe_intermediate_size")
    if not e or not k or not inter:
        raise ValueError(
            "a Gemma 4 config with enable_moe_block needs num_experts, top_k_experts and "
            f"moe_intermediate_size; got {e}, {k}, {inter}"
        )
    if not 0 < k <= e:
        raise ValueError(f"top_k_experts={k} must be between 1 and num_experts={e}")
    return {
        "num_experts": e,
        "num_experts_per_tok": k,
        "moe_intermediate_size": inter,
        "norm_topk_prob": True,
        "moe_beside_mlp": True,
    }


def per_layer_input_params(cfg) -> tuple[int, int]:
    """The per-layer inputs' parameters of a ModelConfig: (the table, counted with the
    embeddings; the rest, kept 16-bit: the projection from the embeddings and its norm, each
    layer's gate, projection and post norm)."""
    width, h, n = cfg.hidden_size_per_layer_input, cfg.hidden_size, cfg.num_layers
    table = cfg.vocab_size_per_layer_input * n * width
    return table, h * n * width + width + n * (2 * h * width + h)
