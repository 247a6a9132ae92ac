"""A hybrid (Qwen3.5) engine on the CPU against its plan: the state pool it allocates is the one
the planner reserved, prefix caching is off with one log line saying why, and stats() counts the
state slots running requests hold (what /v1/stats and the dashboard's KV panel show)."""

from __future__ import annotations

import logging

import pytest

from engine import LLM, SamplingParams
from tests.support.tiny_models import EOS_ID, VOCAB, make_tiny_model
from tests.test_qwen3_5_config import tiny_text_config


@pytest.fixture(scope="module")
def tiny_qwen3_5(tmp_path_factory):
    config = tiny_text_config(vocab_size=VOCAB, eos_token_id=EOS_ID, max_position_embeddings=512)
    return make_tiny_model(config, tmp_path_factory.mktemp("qwen3_5_stats"))


def test_the_engine_allocates_the_planned_state_pool_and_counts_its_slots(tiny_qwen3_5, caplog):
    with caplog.at_level(logging.INFO, logger="engine.startup.planned_config"):
        llm = LLM(str(tiny_qwen3_5), device="cpu", max_model_len=128, max_num_seqs=4)
    engine = llm.engine
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prefix caching")]
    assert len(lines) == 1 and "3 linear-attention layers" in lines[0]
    assert engine.config.prefix_caching is False and engine.stats()["prefix_caching"] is False
    plan = engine.plan
    assert plan.state_pool_bytes == engine.runner.state_pool_bytes > 0
    assert plan.state_pool_bytes == 4 * plan.state_bytes_per_sequence
    stats = engine.stats()
    assert (stats["state_slots_used"], stats["state_slots_total"]) == (0, 4)

    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for i, n in enumerate((5, 9, 13)):
        engine.add_request(str(i), list(range(1, n + 1)), params)
    held = []
    while engine.has_unfinished():
        engine.step()
        s = engine.stats()
        held.append(s["state_slots_used"])
        assert s["state_slots_used"] == s["num_running"]
    assert max(held) == 3 and engine.stats()["state_slots_used"] == 0


def test_a_dense_engine_reports_no_state_slots():
    llm = LLM(device="cpu", max_model_len=128, max_num_seqs=2)  # the embedded SmolLM2
    stats = llm.engine.stats()
    assert stats["state_slots_used"] is None and stats["state_slots_total"] is None
    assert llm.engine.plan.state_pool_bytes == 0 and llm.engine.config.prefix_caching
