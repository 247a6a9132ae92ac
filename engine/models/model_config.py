"""ModelConfig: the parts of a Hugging Face config.json our models need, with each layer's
attention described by data (LayerAttention) and the parameter counts the planner reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.models.architectures import (
    ARCHITECTURES,
    GEMMA3_NAMES,
    GEMMA4_NAMES,
    QWEN3_5_MOE_NAMES,
    QWEN3_5_NAMES,
    supported_names,
)
from engine.models.config_fields import FULL, SLIDING, rope_scaling_from
from engine.models.linear_attention import LINEAR, LinearAttention

if TYPE_CHECKING:
    from engine.models.param_counts import ParamCounts

KV_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
"""Bytes per KV-cache element, by kv_cache_dtype name."""
KV_SCALE_BYTES = {"int8": 2}
"""Scale bytes per token, per KV head, for K and for V: an int8 cache keeps one fp16 scale."""


@dataclass(frozen=True)
class LayerAttention:
    """One layer's attention: the model builds the layer from it, the kernels read its window,
    sinks and soft-cap."""

    head_dim: int
    num_kv_heads: int
    rope_theta: float
    rope_scaling: dict | None = field(default=None, hash=False)
    sliding_window: int | None = None
    """A query sees the last sliding_window tokens, itself included; None: every token."""
    partial_rotary_factor: float = 1.0
    """The share of head_dim that RoPE rotates (the first dims); the rest pass unrotated."""
    sinks: bool = False
    """A learned per-head logit joins each softmax's denominator (gpt-oss)."""
    softcap: float | None = None
    """Logits become softcap * tanh(logits / softcap) before the softmax."""
    kv_shared_from: int | None = None
    """Reads the K/V of this earlier layer and holds no cache of its own."""
    k_eq_v: bool = False
    """V is the K projection's output (before K's norm and RoPE): no v projection (Gemma 4's
    full layers)."""


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
    """config.json's quantization_config, if any (engine/quant/checkpoints.py reads it)."""
    model_type: str | None = None
    """config.json's model_type ("llama", "qwen3", ...)."""
    layer_types: tuple[str, ...] | None = None
    """SLIDING or FULL per layer; None: every layer is sliding when sliding_window is set,
    else full."""
    rope_local_theta: float | None = None
    """RoPE base of the sliding layers where it differs from rope_theta (Gemma 3)."""
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    attention_sinks: bool = False
    num_experts: int = 0
    """Experts per MoE layer; 0: a dense model."""
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    """Renormalise the top-k routing weights to sum to one."""
    dense_layers: tuple[int, ...] = ()
    """In a MoE model, the layers that keep a dense MLP."""
    post_norms: bool = False
    """RMSNorms after attention and after the MLP too, four per layer (Gemma)."""
    query_pre_attn_scalar: float | None = None
    """Attention scores scale by its -1/2 power instead of head_dim's (Gemma)."""
    partial_rotary_factor: float = 1.0
    """The share of head_dim that RoPE rotates (the first dims)."""
    swiglu: tuple[float | None, float | None] = (None, None)
    """gpt-oss's clamped SwiGLU: config.json's (swiglu_alpha, swiglu_limit), None where absent
    (gpt-oss's own values, engine/kernels/moe_ref.py)."""
    global_head_dim: int | None = None
    """Head dim of the full layers where it differs from head_dim (Gemma 4)."""
    global_kv_heads: int | None = None
    """KV heads of the full layers where they differ from num_kv_heads (Gemma 4)."""
    k_eq_v_global: bool = False
    """The full layers take V from the K projection (Gemma 4's attention_k_eq_v)."""
    num_kv_shared_layers: int = 0
    """The last this-many layers hold no K/V: each reads that of the last earlier layer of its
    type (Gemma 4's small models)."""
    hidden_size_per_layer_input: int = 0
    """Per-layer inputs (Gemma 4's PLE, engine/models/gemma4.py): each layer's slice width of
    a table of vocab_size_per_layer_input rows; 0: none."""
    vocab_size_per_layer_input: int = 0
    encoder: dict | None = None
    """A BERT encoder's own fields (type_vocab_size, num_labels: 0 for an embedding model);
    None for a decoder."""
    use_double_wide_mlp: bool = False
    """The layers that read another's K/V have dense MLPs of 2 x intermediate_size (Gemma 4)."""
    moe_beside_mlp: bool = False
    """Each MoE layer keeps its dense MLP beside the experts, whose block has its own pre- and
    post-norms, a router scale [hidden] and per-expert scales (Gemma 4)."""
    linear_attention: LinearAttention | None = None
    """The shape of the LINEAR layers (Qwen3.5), which keep a state per sequence, no KV."""
    shared_expert_intermediate_size: int = 0
    """Each MoE layer's shared expert, a gated MLP every token runs beside its routed experts,
    scaled by a sigmoid gate (Qwen3.5-MoE); 0: none."""
    attn_output_gate: bool = False
    """Attention's output is multiplied by sigmoid of a gate the q projection also computes
    (Qwen3.5's full layers)."""
    vision: dict | None = None
    """A multimodal checkpoint's whole config.json (vision_config, image_token_id, ...): the
    model builds its vision encoder from it (engine/models/vision); None for text-only."""

    def layer_type(self, i: int) -> str:
        if self.layer_types is not None:
            return self.layer_types[i]
        return SLIDING if self.sliding_window is not None else FULL

    def layer_attention(self, i: int) -> LayerAttention:
        """Layer i's attention, from the config's per-layer fields."""
        sliding = self.layer_type(i) == SLIDING
        theta = self.rope_local_theta if sliding and self.rope_local_theta else self.rope_theta
        return LayerAttention(
            head_dim=self.head_dim if sliding else self.global_head_dim or self.head_dim,
            num_kv_heads=(self.num_kv_heads if sliding else self.global_kv_heads)
            or self.num_kv_heads,
            rope_theta=theta,
            rope_scaling=None if sliding and self.rope_local_theta else self.rope_scaling,
            sliding_window=self.sliding_window if sliding else None,
            partial_rotary_factor=self.partial_rotary_factor,
            sinks=self.attention_sinks,
            softcap=self.attn_logit_softcap,
            kv_shared_from=self.kv_source(i),
            k_eq_v=self.k_eq_v_global and not sliding,
        )

    def kv_source(self, i: int) -> int | None:
        """The layer whose K/V layer i reads, for the last num_kv_shared_layers layers: the
        last layer of the same type before them; None for a layer that holds its own."""
        first_shared = self.num_layers - self.num_kv_shared_layers
        if i < first_shared:
            return None
        kind = self.layer_type(i)
        earlier = reversed(range(first_shared))
        source = next((j for j in earlier if self.layer_type(j) == kind), None)
        if source is None:
            raise ValueError(
                f"layer {i} ({kind}) shares K/V, but no earlier layer of its type holds any "
                f"(num_kv_shared_layers={self.num_kv_shared_layers})"
            )
        return source

    def attention_layer_ids(self) -> list[int]:
        """The layers with softmax attention over a KV cache (all but the LINEAR ones)."""
        return [i for i in range(self.num_layers) if self.layer_type(i) != LINEAR]

    def linear_layer_ids(self) -> list[int]:
        """The LINEAR layers, each with a state per sequence."""
        return [i for i in range(self.num_layers) if self.layer_type(i) == LINEAR]

    def kv_layers(self) -> list[int]:
        """The layers that hold K/V in the pool (attention layers not reading another's)."""
        return [i for i in self.attention_layer_ids() if self.kv_source(i) is None]

    def state_bytes_per_sequence(self, recurrent_bytes: int, conv_bytes: int) -> int:
        """What one sequence's linear-attention state takes over every LINEAR layer (0 for a
        model without them), with the given bytes per element of each part."""
        shape = self.linear_attention
        if shape is None:
            return 0
        return len(self.linear_layer_ids()) * shape.state_bytes(recurrent_bytes, conv_bytes)

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts > 0 and i not in self.dense_layers

    def mlp_size(self, i: int) -> int:
        """Layer i's dense-MLP width (doubled where use_double_wide_mlp and i shares K/V)."""
        wide = self.use_double_wide_mlp and self.kv_source(i) is not None
        return self.intermediate_size * (2 if wide else 1)

    def kv_bytes_per_token(self, elem_bytes: int, scale_bytes: int = 0) -> int:
        """The KV-cache formula: 2 (K and V) x layers x KV heads (not attention heads) x
        (head_dim x bytes per element + scale bytes per head, for quantized caches), summed
        over the layers that hold K/V, each with its own KV heads and head dim."""
        total = 0
        for i in self.kv_layers():
            att = self.layer_attention(i)
            total += 2 * att.num_kv_heads * (att.head_dim * elem_bytes + scale_bytes)
        return total

    def kv_cache_bytes_per_token(self, kv_dtype: str) -> int:
        """kv_bytes_per_token for a kv_cache_dtype name (float32, bfloat16, float16, int8);
        the one formula the engine's pool sizing and the appliance planner share."""
        if kv_dtype not in KV_ELEMENT_BYTES:
            raise ValueError(
                f"unknown KV-cache dtype {kv_dtype!r}; known: {list(KV_ELEMENT_BYTES)}"
            )
        return self.kv_bytes_per_token(KV_ELEMENT_BYTES[kv_dtype], KV_SCALE_BYTES.get(kv_dtype, 0))

    def param_counts(self) -> ParamCounts:
        """Parameters by kind (engine/models/param_counts.py counts them)."""
        from engine.models.param_counts import count_params

        return count_params(self)

    @property
    def num_params(self) -> int:
        return self.param_counts().total

    @property
    def num_active_params(self) -> int:
        """What one token's forward reads: every parameter but the unchosen experts'."""
        return self.param_counts().active

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported model architecture {archs or raw.get('model_type')!r}; "
                f"supported: {supported_names()}"
            )
        family: dict = {}
        vision = (
            raw if raw.get("vision_config") and arch.endswith("ForConditionalGeneration") else None
        )
        if arch in GEMMA3_NAMES:
            from engine.models import gemma3_config

            raw = gemma3_config.text_config(raw)
            family = gemma3_config.gemma3_fields(raw)
            rope = gemma3_config.rope_by_layer_type(raw)[0]  # the full layers'
        elif arch in QWEN3_5_NAMES or arch in QWEN3_5_MOE_NAMES:
            from engine.models import qwen3_5_config

            raw = qwen3_5_config.text_config(raw)
            family = qwen3_5_config.qwen3_5_fields(raw)
            rope = qwen3_5_config.rope_parameters(raw)
            if arch in QWEN3_5_MOE_NAMES:
                from engine.models.moe_config import qwen3_5_moe_fields

                family.update(qwen3_5_moe_fields(raw))
        elif arch in GEMMA4_NAMES:
            from engine.models import gemma4_config

            raw = gemma4_config.text_config(raw)
            family, rope = gemma4_config.gemma4_fields(raw), {}
        else:
            rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        act = raw.get("hidden_act") or raw.get("hidden_activation") or "silu"
        if act not in ARCHITECTURES[arch].hidden_acts:
            raise ValueError(
                f"unsupported hidden_act {act!r} for {arch}; expected one of "
                f"{', '.join(ARCHITECTURES[arch].hidden_acts)}"
            )
        rope_theta = float(raw.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        nested = any(isinstance(value, dict) for value in rope.values())  # per layer type
        rope_scaling = None if nested else rope_scaling_from(rope)
        partial = raw.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0
        num_heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // num_heads
        is_qwen2 = arch == "Qwen2ForCausalLM"
        attention_bias = bool(raw.get("attention_bias", False))
        sliding = raw.get("sliding_window")
        layer_types = None
        if is_qwen2:
            sliding = sliding if raw.get("use_sliding_window", False) else None
            layer_types = _qwen2_layer_types(raw) if sliding is not None else None
        elif arch == "Qwen3MoeForCausalLM" and not raw.get("use_sliding_window", False):
            sliding = None  # with it, every layer slides (transformers' Qwen3MoeAttention)
        eos = raw.get("eos_token_id")
        fields = dict(
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
            rope_scaling=rope_scaling,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3Model", "Qwen3MoeForCausalLM"),
            sliding_window=sliding,
            layer_types=layer_types,
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            eos_token_id=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            quantization_config=_quantization_config(raw, arch),
            model_type=raw.get("model_type"),
            partial_rotary_factor=float(partial),
        )
        if arch == "Qwen3MoeForCausalLM":
            from engine.models.moe_config import qwen3_moe_fields

            family = qwen3_moe_fields(raw)
        elif arch == "GptOssForCausalLM":
            from engine.models.moe_config import gpt_oss_fields

            family = gpt_oss_fields(raw)
        elif raw.get("model_type") == "bert":
            labels = len(raw.get("id2label") or {}) if arch.endswith("Classification") else 0
            family = dict(
                rms_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),  # LayerNorm's eps
                encoder={"type_vocab_size": raw.get("type_vocab_size", 2), "num_labels": labels},
            )
        return cls(**{**fields, **family, "vision": vision})

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ValueError(
                f"model folder {folder} has no config.json (expected a Hugging Face "
                "model folder: config.json, *.safetensors, tokenizer files)"
            )
        return cls.from_dict(json.loads(path.read_text()))


def _qwen2_layer_types(raw: dict) -> tuple[str, ...]:
    """Qwen2 with use_sliding_window: config.json's layer_types, or (as transformers builds
    them) full attention below layer max_window_layers and sliding from there on."""
    if raw.get("layer_types"):
        return tuple(raw["layer_types"])
    first = raw.get("max_window_layers", 28)  # transformers' Qwen2Config default
    return tuple(SLIDING if i >= first else FULL for i in range(raw["num_hidden_layers"]))


def _quantization_config(raw: dict, arch: str) -> dict | None:
    """config.json's quantization_config, except gpt-oss's MXFP4 experts: the model's loader
    dequantizes those (engine/models/gpt_oss.py), so the engine sees a 16-bit model."""
    quant = raw.get("quantization_config")
    if arch == "GptOssForCausalLM" and quant and quant.get("quant_method") == "mxfp4":
        return None
    return quant
