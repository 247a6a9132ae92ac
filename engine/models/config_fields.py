"""What ModelConfig (engine/models/model_config.py) and the family config readers
(engine/models/*_config.py) share: config.json's layer-type names and the RoPE types the
engine builds. The family readers import this module, never config.py, which calls them."""

from __future__ import annotations

SLIDING, FULL = "sliding_attention", "full_attention"
"""Layer types, by config.json's `layer_types` names."""

ROPE_TYPES = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "proportional": (),  # partial_rotary_factor and factor optional (Gemma 4's full layers)
}
"""The RoPE types the engine builds (engine/models/rope_tables.py), each with the keys its scaling
dict must hold."""


def rope_scaling_from(params: dict) -> dict | None:
    """A layer's RoPE scaling from config.json's rope_parameters (or older rope_scaling) dict:
    None for plain RoPE, else the dict with its type under `rope_type`, checked against
    ROPE_TYPES and the keys that type needs."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"unsupported rope scaling {rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return None
    missing = [key for key in ROPE_TYPES[rope_type] if params.get(key) is None]
    if missing:
        raise ValueError(f"rope scaling {rope_type!r} needs {', '.join(missing)} in config.json")
    return {**params, "rope_type": rope_type}
