"""Qwen3.5's config.json parsing: defaults, the multimodal checkpoint's text_config, layer
types, the linear layers' shape, parameter counts against transformers' own model, and RoPE
equal to transformers' multimodal rotary embedding at text positions."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

from engine.models.linear_attention import LINEAR, LinearAttention
from engine.models.model_config import FULL, ModelConfig


def tiny_text_config(**overrides) -> Qwen3_5TextConfig:
    fields = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        architectures=["Qwen3_5ForCausalLM"],
    )
    return Qwen3_5TextConfig(**{**fields, **overrides})


def test_fields_from_a_text_config():
    cfg = ModelConfig.from_dict(tiny_text_config().to_dict())
    assert cfg.architecture == "Qwen3_5ForCausalLM"
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL)
    assert cfg.linear_layer_ids() == [0, 1, 2] and cfg.attention_layer_ids() == [3]
    assert cfg.linear_attention == LinearAttention(2, 4, 16, 8, 4)
    assert cfg.attn_output_gate and cfg.qk_norm
    assert cfg.partial_rotary_factor == 0.25 and cfg.rope_scaling is None
    assert cfg.head_dim == 32 and cfg.num_kv_heads == 2


def test_defaults_and_interval_when_fields_are_left_out():
    cfg = ModelConfig.from_dict(
        {
            "architectures": ["Qwen3_5ForCausalLM"],
            "num_hidden_layers": 6,
            "full_attention_interval": 3,
        }
    )
    assert cfg.layer_types == (LINEAR, LINEAR, FULL, LINEAR, LINEAR, FULL)
    assert (cfg.hidden_size, cfg.head_dim, cfg.vocab_size) == (4096, 256, 248_320)
    assert cfg.linear_attention == LinearAttention(16, 32, 128, 128, 4)
    assert cfg.partial_rotary_factor == 0.25


def test_conditional_generation_reads_its_text_config():
    text = tiny_text_config().to_dict()
    text.pop("architectures")
    raw = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"depth": 2},
        "eos_token_id": 7,
        "dtype": "bfloat16",
    }
    cfg = ModelConfig.from_dict(raw)
    assert cfg.architecture == "Qwen3_5ForConditionalGeneration"
    assert cfg.hidden_size == 64 and cfg.eos_token_id == [7] and cfg.torch_dtype == "bfloat16"
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL)


def test_bad_layer_types_are_refused():
    raw = tiny_text_config().to_dict()
    raw["layer_types"] = ["linear_attention", "sliding_attention", "full_attention", "x"]
    with pytest.raises(ValueError, match="layer_types must list 4"):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize("tie", [False, True])
def test_param_counts_equal_transformers_numel(tie):
    hf = tiny_text_config(tie_word_embeddings=tie)
    model = AutoModelForCausalLM.from_config(hf)
    cfg = ModelConfig.from_dict(hf.to_dict())
    assert cfg.num_params == sum(p.numel() for p in model.parameters())
    counts = cfg.param_counts()
    projections = sum(  # every *_proj and in_proj_* weight but the LM head
        p.numel()
        for name, p in model.named_parameters()
        if "proj" in name.split(".")[-2] and not name.startswith("lm_head")
    )
    assert counts.linear == counts.active_linear == projections


def test_rope_equals_transformers_multimodal_rope_at_text_positions():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    from engine.models.rope_tables import RotaryEmbedding

    hf = tiny_text_config(
        head_dim=256,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    )
    cfg = ModelConfig.from_dict(hf.to_dict())
    ours = RotaryEmbedding.for_layer(cfg.layer_attention(3), 300)
    positions = torch.arange(300)
    cos, sin = Qwen3_5TextRotaryEmbedding(hf)(torch.zeros(1), positions[None, None, :])
    torch.testing.assert_close(ours.cos, cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.sin, sin[0], rtol=0, atol=1e-6)
