"""The plan check after warm-up, on the CPU with fake measurements: a peak over the plan shrinks
the KV pool before serving (pool, block manager and graphs agree on the new size), a peak within
it changes nothing, and a pool that cannot shrink enough names the setting to change."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.memory_cap import CAP_ENV, capped, memory_cap_bytes
from engine.memory_check import (
    GIB,
    Measurement,
    MemoryItems,
    blocks_to_shed,
    run_peak_step,
    settle_kv_pool,
)

MIB = 1024**2


def test_blocks_to_shed_covers_the_excess_in_whole_blocks():
    assert blocks_to_shed(10 * GIB, 10 * GIB, MIB) == 0
    assert blocks_to_shed(9 * GIB, 10 * GIB, MIB) == 0
    assert blocks_to_shed(10 * GIB + 1, 10 * GIB, MIB) == 1
    assert blocks_to_shed(10 * GIB + 5 * MIB + 1, 10 * GIB, MIB) == 6


def fake_measure(extra: int, calls: list[str]):
    """A measurement whose peak is the prediction plus `extra` bytes."""

    def measure(engine) -> Measurement:
        calls.append("measure")
        kv = engine.runner.kv_cache.nbytes
        items = MemoryItems(weights=1 * GIB, activation=100 * MIB, kv_pool=kv, context=GIB // 2)
        return Measurement(items, items.total + extra)

    return measure


@pytest.fixture
def llm(tiny_llama):
    return LLM(str(tiny_llama), device="cpu", num_kv_blocks=64, max_model_len=256)


@pytest.fixture
def engine(llm):
    return llm.engine


def spy(engine, calls: list[str]) -> None:
    runner = engine.runner
    alloc, capture = runner.allocate_kv_cache, runner.capture_cuda_graphs
    runner.allocate_kv_cache = lambda n, dt: (calls.append(f"allocate {n}"), alloc(n, dt))
    runner.capture_cuda_graphs = lambda: (calls.append("capture"), capture())


def test_peak_over_the_plan_shrinks_the_pool_before_serving(llm, engine):
    block_bytes = engine.runner.kv_cache.nbytes // 64
    predicted = MemoryItems(GIB, 100 * MIB, 0, 64 * block_bytes, GIB // 2)
    calls: list[str] = []
    spy(engine, calls)
    report = settle_kv_pool(engine, predicted, fake_measure(10 * block_bytes + 1, calls))
    # the pool is re-allocated smaller after the measurement, and graphs captured after that
    assert calls == ["allocate 64", "measure", "allocate 53", "capture"]
    assert report.shed_blocks == 11 and report.final_blocks == 53
    assert engine.config.num_kv_blocks == 53
    assert engine.block_manager.num_blocks == 53
    assert engine.runner.kv_cache.shape[2] == 53
    assert all(a.k_cache.shape[0] == 53 for a in engine.runner.model.attention_layers())
    done = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5, temperature=0.0))
    assert len(done[0].token_ids) == 5
    assert any("shrunk from 64 to 53 blocks" in line for line in report.lines())


def test_peak_within_the_plan_keeps_the_pool(engine):
    kv = engine.runner.kv_cache.nbytes
    predicted = MemoryItems(GIB, 100 * MIB, 0, kv, GIB // 2)
    calls: list[str] = []
    spy(engine, calls)
    report = settle_kv_pool(engine, predicted, fake_measure(-MIB, calls))
    assert calls == ["allocate 64", "measure"]
    assert report.shed_blocks == 0 and engine.block_manager.num_blocks == 64
    assert report.lines()[-1].startswith("memory: measured peak within the plan")
    assert "predicted 1.00 GiB, measured 1.00 GiB (+0.0%)" in report.lines()[0]


def test_a_pool_that_cannot_shrink_enough_names_max_model_len(engine):
    block_bytes = engine.runner.kv_cache.nbytes // 64
    predicted = MemoryItems(GIB, 100 * MIB, 0, 64 * block_bytes, GIB // 2)
    with pytest.raises(ValueError, match="set max_model_len to "):
        settle_kv_pool(engine, predicted, fake_measure(60 * block_bytes, []))


def test_cpu_engine_measures_nothing(engine):
    assert engine.memory is None


def test_peak_step_fills_the_batch_and_leaves_a_clean_engine(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu", max_num_seqs=8, max_num_batched_tokens=64)
    seen = []
    step = llm.engine.step
    llm.engine.step = lambda: (seen.append(len(llm.engine.scheduler.running)), step())[1]
    run_peak_step(llm.engine)
    assert max(seen) == 8
    assert llm.engine.block_manager.num_used_blocks == 0
    assert llm.engine.stats()["num_steps"] == 0 and not llm.engine.has_unfinished()


def test_memory_cap_from_the_environment(monkeypatch):
    monkeypatch.delenv(CAP_ENV, raising=False)
    assert memory_cap_bytes() is None and capped(100, 200) == (100, 200)
    monkeypatch.setenv(CAP_ENV, "24")
    assert memory_cap_bytes() == 24 * GIB
    assert capped(130 * GIB, 140 * GIB) == (14 * GIB, 24 * GIB)
    assert capped(10 * GIB, 20 * GIB) == (10 * GIB, 20 * GIB)  # a cap above the card: no-op
    monkeypatch.setenv(CAP_ENV, "lots")
    with pytest.raises(ValueError, match=CAP_ENV):
        memory_cap_bytes()
