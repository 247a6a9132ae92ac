"""ModelConfig: the parts of a Hugging Face config.json our Llama-family model needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)

KV_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
"""Bytes per KV-cache element, by kv_cache_dtype name."""
KV_SCALE_BYTES = {"int8": 2}
"""Scale bytes per token, per KV head, for K and for V: an int8 cache keeps one fp16 scale."""


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_window: int | None
    torch_dtype: str | None
    eos_token_id: list[int]
    quantization_config: dict | None = None
    """config.json's quantization_config (a bitsandbytes-quantized checkpoint), if any."""
    model_type: str | None = None
    """config.json's model_type ("llama", "qwen3", ...)."""

    def kv_bytes_per_token(self, elem_bytes: int, scale_bytes: int = 0) -> int:
        """The KV-cache formula: 2 (K and V) x layers x KV heads (not attention heads) x
        (head_dim x bytes per element + scale bytes per head, for quantized caches)."""
        return 2 * self.num_layers * self.num_kv_heads * (self.head_dim * elem_bytes + scale_bytes)

    def kv_cache_bytes_per_token(self, kv_dtype: str) -> int:
        """kv_bytes_per_token for a kv_cache_dtype name (float32, bfloat16, float16, int8);
        the one formula the engine's pool sizing and the appliance planner share."""
        if kv_dtype not in KV_ELEMENT_BYTES:
            raise ValueError(
                f"unknown KV-cache dtype {kv_dtype!r}; known: {list(KV_ELEMENT_BYTES)}"
            )
        return self.kv_bytes_per_token(KV_ELEMENT_BYTES[kv_dtype], KV_SCALE_BYTES.get(kv_dtype, 0))

    @property
    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + h

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported model architecture {archs or raw.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {raw.get('hidden_act')!r}; expected 'silu'")
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        rope_theta = float(raw.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"unsupported rope scaling {rope_type!r}; supported: default, llama3")
        num_heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // num_heads
        is_qwen2 = arch == "Qwen2ForCausalLM"
        attention_bias = bool(raw.get("attention_bias", False))
        sliding = raw.get("sliding_window")
        if is_qwen2 and not raw.get("use_sliding_window", False):
            sliding = None
        eos = raw.get("eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope if rope_type == "llama3" else None,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            sliding_window=sliding,
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            eos_token_id=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            quantization_config=raw.get("quantization_config"),
            model_type=raw.get("model_type"),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ValueError(
                f"model folder {folder} has no config.json (expected a Hugging Face "
                "model folder: config.json, *.safetensors, tokenizer files)"
            )
        return cls.from_dict(json.loads(path.read_text()))
