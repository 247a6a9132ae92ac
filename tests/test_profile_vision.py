"""`appliance profile` on a multimodal model folder: the plan holds the vision encoder's bytes,
its image flags move them, and the memory table shows both rows."""

from __future__ import annotations

import json

import pytest

from appliance.cli import main
from engine.models.model_config import ModelConfig
from engine.models.vision_params import vision_params
from tests.support.tiny_vision import tiny_gemma3_vision, tiny_qwen3_5_vision


@pytest.fixture(scope="module")
def gemma3_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3-vision")
    tiny_gemma3_vision(folder)
    return folder


def profile_json(capsys, *args: str) -> dict:
    assert main(["profile", "--device", "cpu", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)["plan"]


def test_profile_json_counts_the_encoder(gemma3_folder, capsys):
    plan = profile_json(capsys, "--model", str(gemma3_folder))
    model = ModelConfig.from_folder(gemma3_folder)
    assert plan["vision_weight_bytes"] == vision_params(model.vision).total * 4  # fp32 on a CPU
    assert plan["vision_activation_bytes"] > 0
    fewer = profile_json(
        capsys,
        "--model",
        str(gemma3_folder),
        "--max-encoder-tokens",
        "16",
        "--max-images-per-request",
        "1",
    )
    assert fewer["vision_activation_bytes"] < plan["vision_activation_bytes"]


def test_image_pixels_size_a_qwen_encoder(tmp_path, capsys):
    tiny_qwen3_5_vision(tmp_path)
    small = profile_json(capsys, "--model", str(tmp_path), "--max-image-pixels", "4096")
    large = profile_json(capsys, "--model", str(tmp_path), "--max-image-pixels", "65536")
    assert large["vision_activation_bytes"] > small["vision_activation_bytes"]
    assert large["vision_weight_bytes"] == small["vision_weight_bytes"] > 0


def test_profile_table_shows_the_vision_rows(gemma3_folder, capsys):
    assert main(["profile", "--device", "cpu", "--model", str(gemma3_folder)]) == 0
    out = capsys.readouterr().out
    assert "vision weights" in out and "the image encoder" in out
    assert "vision activations" in out and "max_encoder_tokens" in out


def test_a_text_model_has_no_vision_rows(capsys):
    assert main(["profile", "--device", "cpu"]) == 0
    assert "vision" not in capsys.readouterr().out
