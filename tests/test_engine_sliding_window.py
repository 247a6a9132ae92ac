"""Mistral with a sliding window (16 tokens) on the CPU path: our greedy tokens equal
transformers' generate and its teacher-forced top tokens (tests/support/greedy_reference.py)
for prompts of 40-70 tokens, past the window; also with chunked prefill whose chunks start
inside the window and a KV pool too small for every sequence (preemption, recompute). A
reference without the window disagrees, so the window is what is being checked. Qwen2 with
use_sliding_window slides only from layer max_window_layers on.

transformers 5.24's Mistral applies the window through its attention mask
(masking_utils.sliding_window_overlay: key k is seen from query q when k > q - W), with the
default sdpa and with eager attention alike (their logits differ by 1.4e-6 on this model)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.models.model_config import ModelConfig
from tests.support.greedy_reference import assert_greedy_agrees, generate_under_pressure
from tests.support.tiny_models import make_tiny_model, tiny_config

WINDOW = 16
NEW_TOKENS = 20
LOGPROB_ATOL = 1e-4  # as tests/test_engine_exact.py


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    lens = [40, 47, 53, 64, 70]
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lens]


@pytest.fixture(scope="module")
def sliding_mistral(tmp_path_factory):
    """(folder, transformers' model with the window, one without it): the same weights."""
    config = tiny_config("mistral")
    config.sliding_window = WINDOW
    folder = make_tiny_model(config, tmp_path_factory.mktemp("tiny-mistral-sliding"))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert hf.config.sliding_window == WINDOW
    full = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, sliding_window=None)
    return folder, hf, full


def _generate(hf, prompts: list[list[int]]) -> list[list[int]]:
    outs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            gen = hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, min_length=0)
        outs.append(gen[0, len(prompt) :].tolist())
    return outs


def test_sliding_window_greedy_equals_transformers(sliding_mistral):
    folder, hf, full = sliding_mistral
    llm = LLM(str(folder), device="cpu")
    assert [a.window for a in llm.engine.runner.model.attention_layers()] == [WINDOW] * 2
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = llm.generate(_prompts(), params)
    assert [o.token_ids for o in outs] == _generate(hf, _prompts())
    assert_greedy_agrees(hf, _prompts(), outs, logprob_atol=LOGPROB_ATOL)
    with pytest.raises(AssertionError):  # attending to every token gives other tokens
        assert_greedy_agrees(full, _prompts(), outs)


def test_sliding_window_under_chunked_prefill_and_preemption(sliding_mistral):
    folder, hf, _ = sliding_mistral
    # 10 blocks x 16 tokens for 5 sequences of up to 90 tokens: the pool cannot hold them all;
    # a 13-token step budget splits prompts into chunks whose first query sits 13, 26, ...
    # tokens in, so each chunk's window starts inside the cached prefix.
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = generate_under_pressure(
        folder, hf, _prompts(), params, num_kv_blocks=10, step_tokens=13, max_model_len=96
    )
    assert [o.token_ids for o in outs] == _generate(hf, _prompts())


def test_qwen2_slides_only_from_max_window_layers(tmp_path):
    """Qwen2 with use_sliding_window: layers below max_window_layers attend to every token,
    the others slide (as transformers builds layer_types, also when config.json lacks them)."""
    config = tiny_config("qwen2")
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, WINDOW, 1
    config.layer_types = ["full_attention", "sliding_attention"]
    folder = make_tiny_model(config, tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["layer_types"] == config.layer_types
    del raw["layer_types"]
    parsed = ModelConfig.from_dict(raw)
    assert [parsed.layer_attention(i).sliding_window for i in range(2)] == [None, WINDOW]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    llm = LLM(str(folder), device="cpu")
    assert [a.window for a in llm.engine.runner.model.attention_layers()] == [None, WINDOW]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = llm.generate(_prompts(), params)
    assert_greedy_agrees(hf, _prompts(), outs, logprob_atol=LOGPROB_ATOL)
