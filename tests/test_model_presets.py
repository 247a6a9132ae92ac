"""Serving a model-shape preset with random weights: the preset becomes a folder with the
embedded tokenizer, and every token the random model samples decodes to text."""

from __future__ import annotations

import json

import pytest

from appliance import model_presets
from appliance.settings import SettingsError, load_settings

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}


@pytest.fixture
def tiny_preset(tmp_path, monkeypatch, embedded_folder):
    presets = tmp_path / "models"
    presets.mkdir()
    (presets / "tiny-llama.json").write_text(json.dumps(TINY))
    monkeypatch.setattr(model_presets, "PRESETS_DIR", presets)
    monkeypatch.setenv("APPLIANCE_CACHE_DIR", str(tmp_path / "cache"))
    # the embedded model's conversion (its tokenizer is the preset's) is the session's, linked
    # in: converting it again here took 20-30 s (tests/test_gguf.py checks the conversion)
    (tmp_path / "cache" / "gguf").mkdir(parents=True)
    (tmp_path / "cache" / "gguf" / embedded_folder.name).symlink_to(embedded_folder)
    return "tiny-llama"


def test_a_preset_serves_random_weights_that_stream_text(tiny_preset, tmp_path):
    from engine import LLM, SamplingParams

    folder = model_presets.resolve_served_model(tiny_preset, "random")
    assert folder == str(tmp_path / "cache" / "presets" / tiny_preset)
    config = json.loads((tmp_path / "cache" / "presets" / tiny_preset / "config.json").read_text())
    assert config["vocab_size"] == 49152 and config["hidden_size"] == 64
    assert config["appliance_preset"]["original_vocab_size"] == 128256
    llm = LLM(folder, device="cpu", load_format="random", max_model_len=256, num_kv_blocks=64)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = llm.generate(["Hello there", "The capital of France is"], params)
    for out in outs:
        assert len(out.token_ids) == 24 and max(out.token_ids) < 49152
        assert out.text.strip()  # greedy random tokens still reach the client as text


def test_presets_need_random_weights_and_real_paths_pass_through(tiny_preset, tmp_path):
    with pytest.raises(ValueError, match="--load-format random"):
        model_presets.resolve_served_model(tiny_preset, "auto")
    assert model_presets.resolve_served_model(str(tmp_path), "random") == str(tmp_path)
    assert model_presets.resolve_served_model(None, "auto") is None
    assert load_settings({"load_format": "random"}, env={}).engine_kwargs()["load_format"] == (
        "random"
    )
    with pytest.raises(SettingsError, match="load_format"):
        load_settings({}, env={"APPLIANCE_LOAD_FORMAT": "dummy"})
