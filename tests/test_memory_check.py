"""The plan check after warm-up, on the CPU with fake measurements: a peak over the plan shrinks
the KV pool before serving (pool, block manager and graphs agree on the new size), a peak within
it changes nothing, and a pool that cannot shrink enough names the setting to change. The
runner runs the check; the engine's scheduler follows its pool."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.memory.memory_cap import CAP_ENV, capped, memory_cap_bytes
from engine.memory.memory_check import GIB, Measurement, MemoryItems, blocks_to_shed
from engine.runner import compile_count
from engine.runner.model_runner import ModelRunner

MIB = 1024**2
PINS = dict(
    device="cpu", num_kv_blocks=64, max_model_len=256, max_num_seqs=4, max_num_batched_tokens=256
)
"""Every memory setting pinned: the plan's prediction is the same for every engine built here."""


def test_blocks_to_shed_covers_the_excess_in_whole_blocks():
    assert blocks_to_shed(10 * GIB, 10 * GIB, MIB) == 0
    assert blocks_to_shed(9 * GIB, 10 * GIB, MIB) == 0
    assert blocks_to_shed(10 * GIB + 1, 10 * GIB, MIB) == 1
    assert blocks_to_shed(10 * GIB + 5 * MIB + 1, 10 * GIB, MIB) == 6


@pytest.fixture
def predicted(tiny_llama) -> MemoryItems:
    """The prediction of the pinned plan (an engine without a check, on the CPU)."""
    return MemoryItems.from_plan(LLM(str(tiny_llama), **PINS).engine.plan)


def fake_measure(predicted: MemoryItems, extra: int, calls: list[str]):
    """A measurement that runs the warm-up workload and reads a peak of the prediction plus
    `extra` bytes."""

    def measure(runner, workload) -> Measurement:
        calls.append("measure")
        workload()
        items = MemoryItems(weights=GIB, activation=100 * MIB, kv_pool=runner.kv_pool_bytes)
        return Measurement(items, predicted.total + extra)

    return measure


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """Records the runner's pool allocations and graph captures, in order."""
    seen: list[str] = []
    alloc, capture = ModelRunner.allocate_kv_cache, ModelRunner.capture_cuda_graphs

    def allocate(self, num_blocks, kv_dtype):
        seen.append(f"allocate {num_blocks}")
        alloc(self, num_blocks, kv_dtype)

    def captured(self):
        seen.append("capture")
        capture(self)

    monkeypatch.setattr(ModelRunner, "allocate_kv_cache", allocate)
    monkeypatch.setattr(ModelRunner, "capture_cuda_graphs", captured)
    return seen


def test_peak_over_the_plan_shrinks_the_pool_before_serving(tiny_llama, predicted, calls):
    block_bytes = predicted.kv_pool // 64
    measure = fake_measure(predicted, 10 * block_bytes + 1, calls)
    llm = LLM(str(tiny_llama), measure=measure, **PINS)
    engine, report = llm.engine, llm.engine.memory
    # the pool is re-allocated smaller after the measurement, and graphs captured after that
    assert calls == ["allocate 64", "measure", "allocate 53", "capture"]
    assert report.shed_blocks == 11 and report.final_blocks == 53
    assert engine.config.num_kv_blocks == 53
    assert engine.block_manager.num_blocks == 53
    assert engine.runner.kv_pool.num_blocks == 53
    assert all(a.k_cache.shape[0] == 53 for a in engine.runner.model.attention_layers())
    done = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5, temperature=0.0))
    assert len(done[0].token_ids) == 5
    assert any("shrunk from 64 to 53 blocks" in line for line in report.lines())
    assert engine.plan_report()["memory_check"]["final_blocks"] == 53


def test_peak_within_the_plan_keeps_the_pool(tiny_llama, predicted, calls):
    llm = LLM(str(tiny_llama), measure=fake_measure(predicted, -MIB, calls), **PINS)
    report = llm.engine.memory
    assert calls == ["allocate 64", "measure"]
    assert report.shed_blocks == 0 and llm.engine.block_manager.num_blocks == 64
    assert report.lines()[-1].startswith("memory: measured peak within the plan")
    weights = predicted.weights / GIB
    assert f"predicted {weights:.2f} GiB, measured 1.00 GiB" in report.lines()[0]
    assert llm.engine.stats()["num_steps"] == 0  # the warm-up's steps are not counted


def test_compiles_are_counted_from_the_end_of_warm_up(tiny_llama, predicted, calls):
    """Kernels built during warm-up (here: announced to the listener while the warm-up runs)
    are not counted; one built while serving is."""
    inner = fake_measure(predicted, -MIB, calls)

    def measure(runner, workload):
        for _ in range(3):
            compile_count.counter.on_compile(cache_hit=False)
        return inner(runner, workload)

    engine = LLM(str(tiny_llama), measure=measure, **PINS).engine
    if not compile_count.install():  # no Triton with a compilation listener: unknown
        assert engine.stats()["compiles_after_warmup"] is None
        return
    assert engine.stats()["compiles_after_warmup"] == 0
    compile_count.counter.on_compile(cache_hit=True)
    assert engine.stats()["compiles_after_warmup"] == 1


def test_a_pool_that_cannot_shrink_enough_names_max_model_len(tiny_llama, predicted):
    measure = fake_measure(predicted, 60 * (predicted.kv_pool // 64), [])
    with pytest.raises(ValueError, match="set max_model_len to "):
        LLM(str(tiny_llama), measure=measure, **PINS)


def test_cpu_engine_measures_nothing(tiny_llama):
    engine = LLM(str(tiny_llama), **PINS).engine
    assert engine.memory is None and engine.plan_report()["memory_check"] is None


def test_peak_step_fills_the_batch_and_leaves_a_clean_engine(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu", max_num_seqs=8, max_num_batched_tokens=64)
    seen = []
    step = llm.engine.step
    llm.engine.step = lambda: (seen.append(len(llm.engine.scheduler.running)), step())[1]
    llm.engine.run_peak_step()
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
