"""Qwen3.5's config.json, read into ModelConfig's fields: the text model's defaults
(transformers' Qwen3_5TextConfig), the text part of a Qwen3_5ForConditionalGeneration
checkpoint, the layer types (Gated DeltaNet LINEAR layers and gated FULL attention layers) and
the linear layers' shape. Torch-free (the planner reads it).

RoPE: Qwen3.5 rotates the first partial_rotary_factor (0.25) of each full layer's head dim
with a multimodal RoPE whose three sections (time, height, width: `mrope_section`) take
their frequencies from three position streams. For text every stream holds the token's
position, so each frequency sees the same position and the rotation is plain RoPE over the
rotated dims (tests/test_qwen3_5.py checks the tables against transformers' rotary
embedding)."""

from __future__ import annotations

from engine.models.config_fields import FULL
from engine.models.linear_attention import LINEAR, LinearAttention

TEXT_DEFAULTS = {
    "vocab_size": 248_320,
    "hidden_size": 4096,
    "intermediate_size": 12_288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}
"""transformers' Qwen3_5TextConfig defaults: a config.json may leave any of these out."""

FULL_ATTENTION_INTERVAL = 4
"""Without layer_types, every full_attention_interval-th layer (default 4) is full attention
and the others are linear (Qwen3_5TextConfig)."""

PARTIAL_ROTARY_FACTOR = 0.25
"""The share of a full layer's head dim that RoPE rotates unless config.json says otherwise."""


def text_config(raw: dict) -> dict:
    """A Qwen3.5 config.json as a flat text-model config with the defaults filled in: a
    Qwen3_5ForConditionalGeneration's `text_config` takes the top level's architectures, dtype,
    EOS ids and tied embeddings (the vision tower's weights are skipped at load)."""
    if "text_config" in raw:
        text = dict(raw["text_config"] or {})
        for key in ("architectures", "torch_dtype", "dtype", "eos_token_id"):
            if raw.get(key) is not None:
                text[key] = raw[key]
        if raw.get("tie_word_embeddings") is not None:
            text.setdefault("tie_word_embeddings", raw["tie_word_embeddings"])
        raw = text
    return {**TEXT_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}


def layer_types(raw: dict) -> tuple[str, ...]:
    """LINEAR or FULL per layer: `layer_types`, else every full_attention_interval-th layer
    full."""
    n = raw["num_hidden_layers"]
    types = raw.get("layer_types")
    if types is None:
        interval = raw.get("full_attention_interval") or FULL_ATTENTION_INTERVAL
        types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n)]
    if len(types) != n or set(types) - {LINEAR, FULL}:
        raise ValueError(
            f"layer_types must list {n} entries (num_hidden_layers), each {LINEAR!r} or "
            f"{FULL!r}; got {list(types)}"
        )
    return tuple(types)


def rope_parameters(raw: dict) -> dict:
    """The full layers' RoPE parameters: `rope_parameters` (or the older `rope_scaling` with
    `rope_theta`), without the multimodal keys, which change nothing for text positions."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    for key in ("mrope_section", "mrope_interleaved"):
        params.pop(key, None)
    if raw.get("rope_theta") is not None:
        params.setdefault("rope_theta", raw["rope_theta"])
    return params


def qwen3_5_fields(raw: dict) -> dict:
    """ModelConfig fields that Qwen3.5 sets its own way (`raw` from text_config)."""
    rope = raw.get("rope_parameters") or {}
    partial = raw.get("partial_rotary_factor") or rope.get("partial_rotary_factor")
    return {
        "layer_types": layer_types(raw),
        "linear_attention": LinearAttention(
            num_key_heads=raw["linear_num_key_heads"],
            num_value_heads=raw["linear_num_value_heads"],
            key_head_dim=raw["linear_key_head_dim"],
            value_head_dim=raw["linear_value_head_dim"],
            conv_kernel=raw["linear_conv_kernel_dim"],
        ),
        "attn_output_gate": True,
        "qk_norm": True,
        "partial_rotary_factor": float(partial or PARTIAL_ROTARY_FACTOR),
    }
