"""The planner counts a multimodal model's vision encoder: its weights and its activation peak
come out of the KV pool (engine/planner/vision_bytes.py)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from appliance.settings import ServeSettings
from engine.config import EngineConfig
from engine.models.model_config import ModelConfig
from engine.models.vision_params import vision_params
from engine.multimodal.images import MAX_IMAGE_PIXELS
from engine.planner import GIB, Device, PlanRequest, plan
from engine.planner.vision_bytes import vision_activation_bytes, vision_weight_bytes

PRESETS = Path(__file__).resolve().parent.parent / "profiles" / "models"
SO400M = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "patch_size": 14,
    "image_size": 896,
}


def gemma3_12b(vision: bool) -> ModelConfig:
    """Gemma 3 12B as Gemma3ForConditionalGeneration, with or without its vision_config."""
    text = json.loads((PRESETS / "gemma-3-12b.json").read_text())
    raw = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text,
        "mm_tokens_per_image": 256,
    }
    if vision:
        raw["vision_config"] = {**SO400M, "model_type": "siglip_vision_model"}
    return ModelConfig.from_dict(raw)


def qwen3_5(**vision) -> ModelConfig:
    text = json.loads((PRESETS / "qwen3.5-27b.json").read_text())
    raw = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"out_hidden_size": text["hidden_size"], **vision},
    }
    return ModelConfig.from_dict(raw)


H100 = Device(kind="cuda", name="synthetic 80 GiB", total_bytes=80 * GIB)
PINS = dict(max_num_seqs=16, quantization="none", kv_cache_dtype="bfloat16", dtype="bfloat16")


def test_the_kv_pool_shrinks_by_the_vision_bytes():
    text, multi = gemma3_12b(False), gemma3_12b(True)
    assert text.vision is None and multi.vision is not None
    a, b = plan(text, H100, PlanRequest(**PINS)), plan(multi, H100, PlanRequest(**PINS))
    assert a.vision_weight_bytes == a.vision_activation_bytes == 0
    assert b.weight_bytes == a.weight_bytes  # the text model's, as before
    assert b.vision_weight_bytes == vision_params(multi.vision).total * 2
    assert 0.75 * GIB < b.vision_weight_bytes < 0.8 * GIB  # about 0.42 B parameters
    vision = b.vision_weight_bytes + b.vision_activation_bytes
    block = b.block_size * b.kv_bytes_per_token
    # the pool is whole blocks: it shrinks by the vision bytes, rounded to a block
    assert vision - block < a.kv_pool_bytes - b.kv_pool_bytes < vision + block
    assert a.activation_bytes == b.activation_bytes and a.graph_pool_bytes == b.graph_pool_bytes


def test_gemma3_activation_arithmetic():
    """A step's 2,048 placeholder rows are 8 images of 256 rows, 16 patches each: 32,768
    patches x (8 x 1152 + 2 x 4304 elements x 2 B + 588 pixels x (4 + 2) B), plus 8 images'
    rows of 3,840 x 2 B kept for one request."""
    m = gemma3_12b(True)
    peak = vision_activation_bytes(m, 2, 2048, MAX_IMAGE_PIXELS, 8)
    assert peak == 32768 * ((8 * 1152 + 2 * 4304) * 2 + 588 * 6) + 8 * 256 * 3840 * 2
    half = vision_activation_bytes(m, 2, 1024, MAX_IMAGE_PIXELS, 8)
    assert half == 16384 * ((8 * 1152 + 2 * 4304) * 2 + 588 * 6) + 8 * 256 * 3840 * 2
    # past fused attention: the step's 8 images' fp32 scores, 4096^2 x 16 heads each
    unfused = vision_activation_bytes(m, 2, 2048, MAX_IMAGE_PIXELS, 8, fused_attention=False)
    assert unfused - peak == 8 * 4096**2 * 16 * 4


def test_qwen_peak_follows_the_image_limit_one_image_at_a_time():
    m = qwen3_5()
    small = vision_activation_bytes(m, 2, 2048, 1024 * 1024, 1)
    large = vision_activation_bytes(m, 2, 2048, 4 * 1024 * 1024, 1)
    cached = {n: n // 4 * 5120 * 2 for n in (4096, 16384)}  # one image's merged rows
    # one image's patches at a time: 4,096 patches of 16 x 16 pixels, then four times that
    assert large - cached[16384] == 4 * (small - cached[4096])
    many = vision_activation_bytes(m, 2, 2048, 1024 * 1024, 8)
    assert many - small == 7 * cached[4096]


def test_quantization_leaves_the_vision_weights_in_16_bits():
    m = gemma3_12b(True)
    dense = vision_weight_bytes(m, "none", 2, 64, None)
    assert vision_weight_bytes(m, "int8", 2, 64, None) == dense
    assert dense == vision_params(m.vision).total * 2
    q = plan(m, H100, PlanRequest(**{**PINS, "quantization": "int8"}))
    assert q.vision_weight_bytes == dense


def test_an_int8_engine_keeps_its_vision_encoder_in_16_bits(tmp_path):
    from torch import nn

    from engine import LLM
    from tests.support.tiny_vision import tiny_gemma3_vision

    tiny_gemma3_vision(tmp_path)
    llm = LLM(str(tmp_path), device="cpu", quantization="int8", max_model_len=128)
    model = llm.engine.runner.model
    vision = [type(m) for m in model.vision.modules() if hasattr(m, "weight")]
    assert nn.Linear in vision or any(issubclass(t, nn.Linear) for t in vision)
    assert not [t for t in vision if t.__name__ == "QuantLinear"]
    assert any(type(m).__name__ == "QuantLinear" for m in model.layers.modules())


def test_a_tight_card_names_the_vision_encoder():
    small = Device(kind="cuda", name="synthetic 24 GiB", total_bytes=24 * GIB)
    with pytest.raises(ValueError, match="a vision encoder.s weights"):
        plan(gemma3_12b(True), small, PlanRequest(**{**PINS, "num_kv_blocks": None}))


def test_request_fields_and_defaults():
    assert PlanRequest().max_image_pixels == MAX_IMAGE_PIXELS
    serve = {f.name: f.default for f in fields(ServeSettings)}
    assert PlanRequest().max_images_per_request == serve["max_images_per_request"]
    assert PlanRequest().max_image_pixels == serve["max_image_pixels"]
    assert PlanRequest().max_encoder_tokens == EngineConfig().max_encoder_tokens
    assert PlanRequest.from_config(EngineConfig(max_encoder_tokens=512)).max_encoder_tokens == 512
    with pytest.raises(ValueError, match="max_image_pixels"):
        PlanRequest(max_image_pixels=0)
