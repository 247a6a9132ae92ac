"""The start-up breakdown: the phases an engine's start-up ran, in order, with their seconds
adding up to the total; kept as a plain dict (it crosses to another process), reported by
plan_report() and logged in one line."""

from __future__ import annotations

import logging
import pickle

import pytest

from engine import LLM
from engine.memory.memory_check import GIB, Measurement, MemoryItems
from engine.startup.phases import StartupTimer, startup_line

PINS = dict(
    device="cpu", num_kv_blocks=64, max_model_len=256, max_num_seqs=4, max_num_batched_tokens=256
)
CPU_PHASES = ["config", "plan", "tokenizer", "load", "kv_alloc", "total"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_nested_phase_pauses_the_outer_one(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr("engine.startup.phases.time.perf_counter", clock)
    timer = StartupTimer()
    clock.now += 1.0  # outside every phase: counted in the total only
    with timer.phase("check"):
        clock.now += 2.0
        with timer.phase("warm_up"):
            clock.now += 5.0
        clock.now += 0.5
    with timer.phase("check"):  # a phase entered again adds up
        clock.now += 0.25
    assert timer.report() == {"warm_up": 5.0, "check": 2.75, "total": 8.75}
    line = startup_line({"kv_alloc": 0.25, "total": 3.04})
    assert line == "startup: kv alloc 0.2 s, total 3.0 s"


def test_cpu_engine_reports_its_phases_adding_up_to_the_total(tiny_llama, caplog):
    with caplog.at_level(logging.INFO, logger="engine.llm_engine"):
        engine = LLM(str(tiny_llama), **PINS).engine
    startup = engine.startup_s
    assert list(startup) == CPU_PHASES
    assert all(type(s) is float and s >= 0 for s in startup.values())
    parts = sum(s for name, s in startup.items() if name != "total")
    assert parts <= startup["total"]
    assert startup["total"] - parts < 0.05 + 0.05 * startup["total"]
    assert pickle.loads(pickle.dumps(engine.plan_report()))["startup_s"] == startup
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("startup: ")]
    assert lines == [startup_line(startup)]
    assert lines[0].startswith("startup: config ") and f"total {startup['total']:.1f} s" in lines[0]


def test_a_measured_start_adds_the_memory_check_and_its_warm_up(tiny_llama):
    """With a measurement (CUDA's, faked here on the CPU) the warm-up runs inside the memory
    check and each gets its own share."""

    def measure(runner, workload) -> Measurement:
        workload()
        items = MemoryItems(weights=GIB, kv_pool=runner.kv_pool_bytes)
        return Measurement(items, 0)

    startup = LLM(str(tiny_llama), measure=measure, **PINS).engine.startup_s
    assert list(startup) == [*CPU_PHASES[:-1], "warm_up", "memory_check", "total"]
    assert startup["warm_up"] > 0
    parts = sum(s for name, s in startup.items() if name != "total")
    assert startup["total"] == pytest.approx(parts, abs=0.05 + 0.05 * startup["total"])


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [False, True])
def test_cuda_engine_reports_every_phase(tiny_llama, eager):
    """Kernel choice and graph capture (none with enforce_eager) run inside the memory check,
    before its warm-up."""
    startup = LLM(
        str(tiny_llama), device="cuda", dtype="bfloat16", max_num_seqs=4, enforce_eager=eager
    ).engine.startup_s
    measured = ["kernel_choice", *([] if eager else ["graph_capture"]), "warm_up", "memory_check"]
    assert list(startup) == [*CPU_PHASES[:-1], *measured, "total"]
    parts = sum(s for name, s in startup.items() if name != "total")
    assert startup["total"] == pytest.approx(parts, abs=0.05 + 0.05 * startup["total"])


def test_an_engine_tells_each_phase_as_it_begins_and_converts_a_gguf_once(tmp_path, monkeypatch):
    """What the engine core reports to the front end (and /health shows): the first start on a
    .gguf file converts it, a second start finds the conversion cached."""
    from engine.llm_engine import LLMEngine
    from engine.startup.phases import phase_words
    from tests.support.tiny_models import write_tiny_gguf

    monkeypatch.setenv("APPLIANCE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    pins = {**PINS, "max_model_len": 128}  # the file's context length
    first: list[str] = []
    engine = LLMEngine(str(path), on_phase=first.append, **pins)
    assert first == ["convert", *CPU_PHASES[:-1]]
    assert list(engine.startup_s) == ["convert", *CPU_PHASES]
    again: list[str] = []
    engine = LLMEngine(str(path), on_phase=again.append, **pins)
    assert again == CPU_PHASES[:-1] and "convert" not in engine.startup_s
    assert phase_words("convert").startswith("converting the GGUF file")
    assert phase_words("load") == "loading weights"


def test_a_phase_inside_another_tells_the_outer_again_when_it_resumes():
    told: list[str] = []
    timer = StartupTimer(told.append)
    with timer.phase("memory_check"):
        with timer.phase("warm_up"):
            pass
    with timer.phase("kv_alloc"):
        pass
    assert told == ["memory_check", "warm_up", "memory_check", "kv_alloc"]
