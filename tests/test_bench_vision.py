"""benchmarks/bench_vision.py: its shapes as transformers and the engine read them, the FLOPs of
its floor against hand-computed numbers, and a tiny CPU run of both parts."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Gemma3Config, Qwen3_5Config, SiglipVisionModel

from benchmarks import bench_vision
from benchmarks import bench_vision_shapes as shapes
from engine.models.architectures import model_class
from engine.models.model_config import ModelConfig


def test_encoder_flops_of_a_hand_computed_case():
    shape = shapes.EncoderShape(tower_params=10, head_params=3, hidden_size=4, num_layers=2)
    # 2 x 10 x 5 patches + 2 x 3 x 2 rows + 4 x 5^2 x 4 x 2 layers
    assert shapes.encoder_flops(shape, num_patches=5, num_rows=2) == 100 + 12 + 800


def test_gemma3_12b_encoder_and_prompt_flops():
    config = shapes.checkpoint_config("gemma3-12b")
    layer = 4 * 1152 * 1152 + 2 * 1152 * 4304  # q, k, v, o and the MLP
    patch_embedding = 3 * 14 * 14 * 1152
    enc = shapes.encoder_shape(config)
    assert enc == shapes.EncoderShape(27 * layer + patch_embedding, 1152 * 3840, 1152, 27)
    image = shapes.image_shape(config, 896, 896)
    assert (image.num_patches, image.num_tokens) == (4096, 256)
    want = 2 * (enc.tower_params * 4096 + 1152 * 3840 * 256) + 4 * 4096**2 * 1152 * 27
    assert shapes.encoder_flops(enc, 4096, 256) == want
    # the text model without its 262208 x 3840 embedding: attention, MLP and norms
    attention = 3840 * (16 * 256 + 2 * 8 * 256) + 16 * 256 * 3840
    norms = 4 * 3840 + 2 * 256
    text = shapes.text_shape(config)
    assert text.num_params == 48 * (attention + 3 * 3840 * 15360 + norms) + 3840
    assert text.flop_params == text.num_params


def test_qwen3_5_27b_screenshot_grid():
    config = shapes.checkpoint_config("qwen3.5-27b")
    assert shapes.qwen_grid(config["vision_config"], 1280, 720) == (1, 44, 80)  # 1280 x 704
    image = shapes.image_shape(config, 1280, 720)
    assert (image.num_patches, image.num_tokens) == (3520, 880)
    data = shapes.random_image(config, 1280, 720, seed=0)
    assert data["pixel_values"].shape == (3520, 3 * 2 * 16 * 16)
    assert data["image_grid_thw"].tolist() == [[1, 44, 80]]


def _matrices(model: torch.nn.Module) -> int:
    """Weights of dimension 2 or more, position embeddings left out."""
    return sum(p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and "pos" not in n)


def test_gemma3_shape_as_transformers_and_the_engine_read_it():
    config = shapes.checkpoint_config("gemma3-12b")
    hf = Gemma3Config(**config)
    assert (hf.vision_config.num_hidden_layers, hf.vision_config.image_size) == (27, 896)
    assert (hf.text_config.num_hidden_layers, hf.image_token_id, hf.mm_tokens_per_image) == (
        48, 262144, 256,
    )  # fmt: skip
    mc = ModelConfig.from_dict(config)
    assert mc.architecture == "Gemma3ForConditionalGeneration" and mc.vision is config
    assert (mc.hidden_size, mc.num_layers) == (3840, 48)
    with torch.device("meta"):
        tower = SiglipVisionModel(hf.vision_config)
    enc = shapes.encoder_shape(config)
    assert enc.tower_params == _matrices(tower)
    assert enc.head_params == 1152 * 3840  # mm_input_projection_weight


def test_qwen3_5_shape_as_transformers_and_the_engine_read_it():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    config = shapes.checkpoint_config("qwen3.5-27b")
    hf = Qwen3_5Config(**config)
    assert (hf.vision_config.depth, hf.vision_config.out_hidden_size) == (27, 5120)
    assert (hf.text_config.num_hidden_layers, hf.image_token_id) == (64, 248056)
    mc = ModelConfig.from_dict(config)
    assert mc.architecture == "Qwen3_5ForConditionalGeneration" and mc.vision is config
    assert mc.hidden_size == 5120
    with torch.device("meta"):
        tower = Qwen3_5VisionModel(hf.vision_config)
    enc = shapes.encoder_shape(config)
    assert enc.tower_params + enc.head_params == _matrices(tower)
    merged = 1152 * 4
    assert enc.head_params == merged * merged + merged * 5120


TINY = ["--tiny", "--repeats", "2", "--warmups", "1", "--max-model-len", "128"]


def test_tiny_gemma3_run_measures_both_parts(tmp_path, capsys):
    args = ["--concurrency", "2", "--output-tokens", "4", "--alone-steps", "2"]
    figures = bench_vision.main([*TINY, *args, "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "bench_vision_gemma3-12b-tiny.json").read_text())
    assert saved == json.loads(json.dumps(figures))
    ttft = figures["ttft"]
    assert len(ttft["ttft_s"]) == 2 and all(t > 0 for t in ttft["ttft_s"])
    assert all(ms > 0 for ms in ttft["encoder_ms"])  # every measured request ran the encoder
    assert ttft["prompt_tokens"] == 1 + 16 + 1 + bench_vision.QUESTION_TOKENS
    assert ttft["floor_s"] > 0
    mixed = figures["throughput"]
    assert mixed["image_output_tokens"] == 2 * 4
    assert mixed["tpot_alone_s"] and mixed["tpot_prefill_s"]
    assert len(mixed["image_ttft_s"]) == 2
    assert mixed["text_output_tokens"] > 0  # the text requests kept decoding
    out = capsys.readouterr().out
    assert "ratio TTFT / floor" in out and "text decode TPOT" in out


def test_tiny_qwen3_5_ttft():
    figures = bench_vision.main([*TINY, "--model", "qwen3.5-27b", "--skip-throughput"])
    assert figures["throughput"] is None
    ttft = figures["ttft"]
    assert ttft["num_patches"] == 8 * 16  # 64 x 36 px: 64 x 32 in 4-px patches
    assert ttft["prompt_tokens"] == 1 + 32 + 1 + bench_vision.QUESTION_TOKENS


@pytest.mark.parametrize("model", list(shapes.MODELS))
def test_the_engine_builds_each_full_shape(model):
    """The engine's model class of each shape (on the meta device): the text model of the
    preset's size plus its vision encoder."""
    config = shapes.checkpoint_config(model)
    mc = ModelConfig.from_dict(config)
    with torch.device("meta"):
        built = model_class(mc.architecture)(mc, 4096)
    assert built.vision is not None
    vision = sum(p.numel() for p in built.vision.parameters())
    assert sum(p.numel() for p in built.parameters()) == mc.num_params + vision
    enc = shapes.encoder_shape(config)  # the rest: position embeddings, biases and norms
    assert enc.tower_params + enc.head_params < vision < 1.02 * (enc.tower_params + enc.head_params)
