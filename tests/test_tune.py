"""The tuner's search against a simulated server whose latency grows with concurrency (probes
the server disturbed measured again), the stall and compile rules, the binding SLO, drift
detection, and the tuned profile's TOML round trip."""

from __future__ import annotations

import pytest

from appliance.loadgen.client import RequestResult
from appliance.loadgen.load_shapes import StatsSample
from appliance.loadgen.report import SLO, LevelSummary
from appliance.tune import (
    TunedProfile,
    detect_drift,
    load_tuned_profile,
    search,
    write_tuned_profile,
)
from appliance.tune_probe import MAX_REPEATS, Measured, binding, disturbances, longest_silence
from appliance.tune_sweep import PointResult, parse_sweep, pick_best, point_env


def simulated(knee: int, slo: SLO):
    """p95 TPOT rises linearly and crosses the limit just after `knee`."""
    calls: list[int] = []

    async def measure(c: int) -> LevelSummary:
        calls.append(c)
        tpot = slo.tpot_s * (0.5 + 0.5 * c / (knee + 0.5))
        lat = {"tpot_s": {"p95": tpot}, "ttft_s": {"p95": 0.1}}
        return LevelSummary(c, "closed", 10, 10, {}, 1.0, 10.0, 100.0 * c, 0.0, 10.0, 1.0, lat)

    return measure, calls


@pytest.mark.parametrize("knee,start", [(32, 4), (27, 4), (5, 1), (3, 4), (1, 4), (100, 1)])
async def test_search_finds_the_knee(knee, start):
    slo = SLO(tpot_s=0.05)
    measure, calls = simulated(knee, slo)
    result = await search(measure, slo, start=start, max_concurrency=256)
    assert result.best == knee and result.first_bad == knee + 1
    assert len(calls) == len(set(calls))  # no level measured twice
    assert calls[0] == start
    doubling = [c for c in calls if c > start and c & (c - 1) == 0]
    assert calls[: len(doubling) + 1] == [start] + doubling or start > knee


async def test_search_stops_at_the_maximum_and_reports_total_failure():
    slo = SLO(tpot_s=0.05)
    measure, _ = simulated(1000, slo)
    result = await search(measure, slo, start=4, max_concurrency=48)
    assert result.best == 48 and result.first_bad is None
    measure, _ = simulated(0, slo)
    result = await search(measure, slo, start=4)
    assert result.best is None and result.first_bad == 1


async def test_errors_break_the_slo_even_when_fast():
    async def measure(c: int) -> LevelSummary:
        errors = {"http 429": c - 8} if c > 8 else {}
        n_ok = 100 - sum(errors.values())
        lat = {"ttft_s": {"p95": 0.01}}
        return LevelSummary(c, "closed", 100, n_ok, errors, 1, 1, 1, 1, 1, 1, lat)

    result = await search(measure, SLO(ttft_s=1.0), start=4)
    assert result.best == 9  # 1 failure in 100 is allowed, 2 are not


def _result(start: float, ttft: float) -> RequestResult:
    return RequestResult(1, start, ok=True, ttft_s=ttft, e2e_s=ttft + 1, num_output_tokens=11)


def test_drift_detects_creeping_latency_and_memory():
    flat = [_result(t, 0.1) for t in range(30)]
    mem = [StatsSample(t, gpu_memory_used_bytes=10 * 2**30) for t in range(30)]
    assert detect_drift(flat, mem).stable
    creeping = [_result(t, 0.1 * (1 + t / 10)) for t in range(30)]
    assert any("ttft" in n for n in detect_drift(creeping, mem).notes)
    growing = [StatsSample(t, gpu_memory_used_bytes=(10 + t / 10) * 2**30) for t in range(30)]
    drift = detect_drift(flat, growing)
    assert not drift.stable and "memory" in drift.notes[0] and drift.memory_growth_bytes > 0


def test_profile_round_trips(tmp_path):
    prof = TunedProfile(
        name="smollm-cpu",
        created="2026-01-01T00:00:00",
        hardware={"gpu": "cpu", "device": "cpu"},
        model={"name": 'Smol "LM"', "dtype": "float32", "quantization": "none"},
        chosen={"max_concurrency": 6, "max_num_seqs": 6, "max_num_batched_tokens": 2048},
        capacity={"request_throughput": 1.25, "ttft_p95_s": 0.4, "first_bad_concurrency": 7},
        slo={"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 95.0},
        workload={"input_len": "uniform:64-256", "prefix_len": 0},
        soak={"duration_s": 10.0, "stable": False, "notes": ["p95 ttft grew 1.30x"]},
    )
    path = write_tuned_profile(prof, tmp_path)
    assert path == tmp_path / "smollm-cpu.toml"
    assert load_tuned_profile(path) == prof
    assert load_tuned_profile(path).max_concurrency == 6
    with pytest.raises(FileNotFoundError):
        load_tuned_profile("no-such-profile-anywhere")
    (tmp_path / "bad.toml").write_text("name = 'x'\n")
    with pytest.raises(ValueError, match="not a tuned profile"):
        load_tuned_profile(tmp_path / "bad.toml")
    with pytest.raises(ValueError):
        TunedProfile(name="../escape")


async def test_resolution_stops_the_binary_search_early():
    slo = SLO(tpot_s=0.05)
    measure, exact_calls = simulated(300, slo)
    await search(measure, slo, start=4, max_concurrency=1024)
    measure, calls = simulated(300, slo)
    result = await search(measure, slo, start=4, max_concurrency=1024, resolution=0.1)
    assert 270 <= result.best <= 300 and result.first_bad - result.best <= 30
    assert len(calls) < len(exact_calls)


def test_sweep_grid_is_every_combination_with_typed_values():
    points = parse_sweep(["max_num_seqs=32,64", "adaptive-batching=off,on"])
    assert points == [
        {"max_num_seqs": 32, "adaptive_batching": False},
        {"max_num_seqs": 32, "adaptive_batching": True},
        {"max_num_seqs": 64, "adaptive_batching": False},
        {"max_num_seqs": 64, "adaptive_batching": True},
    ]
    assert point_env(points[1]) == {
        "APPLIANCE_MAX_NUM_SEQS": "32",
        "APPLIANCE_ADAPTIVE_BATCHING": "1",
    }
    for bad in (["max_num_seqs=many"], ["port=1,2"], ["max_num_seqs"], ["a=1", "a=2"]):
        with pytest.raises(ValueError):
            parse_sweep(bad)


async def test_the_sweep_picks_the_point_with_the_highest_capacity():
    slo = SLO(tpot_s=0.05)
    rows = []
    for point, knee in (
        ({"adaptive_batching": False}, 24),
        ({"adaptive_batching": True}, 40),
        ({"max_num_seqs": 8}, 0),
    ):
        measure, _ = simulated(knee, slo)
        rows.append(PointResult(point, await search(measure, slo, start=4)))
    best = pick_best(rows)
    assert best.point == {"adaptive_batching": True} and best.result.best == 40
    assert pick_best(rows[2:]) is None


async def test_a_disturbed_probe_is_repeated_then_believed():
    """Disturbed tries are measured again up to MAX_REPEATS times; a level disturbed every time
    is believed on its last try, and the probe says so."""
    slo = SLO(tpot_s=0.05)
    inner, calls = simulated(10, slo)
    disturbed_tries = {4: 1, 8: 99}  # 4: once; 8: every try

    async def measure(c: int) -> Measured:
        summary = await inner(c)
        if disturbed_tries.get(c, 0) > 0:
            disturbed_tries[c] -= 1
            return Measured(summary, [f"compiles at {c}"])
        return Measured(summary)

    result = await search(measure, slo, start=4, max_concurrency=16)
    assert result.best == 10 and result.first_bad == 11
    by_level = {p.concurrency: p for p in result.probes}
    assert by_level[4].attempts == 2 and by_level[4].disturbances == []
    assert by_level[8].attempts == 1 + MAX_REPEATS
    assert by_level[8].discarded == ["compiles at 8"] * MAX_REPEATS
    assert by_level[8].disturbances == ["compiles at 8"]
    assert calls.count(8) == 1 + MAX_REPEATS and len(result.probes) == len(set(calls))


def _stream(start: float, times: list[float]) -> RequestResult:
    """A finished request whose tokens arrived at `times` (seconds from the run's start)."""
    itl = [b - a for a, b in zip(times, times[1:])]
    return RequestResult(
        1, start, ok=True, ttft_s=times[0] - start, e2e_s=times[-1] - start, itl_s=itl
    )


def test_a_stall_is_a_silence_in_every_stream_at_once():
    steady = [_stream(0.0, [0.1 * k + 0.01 * i for k in range(1, 30)]) for i in range(4)]
    assert longest_silence(steady)[0] < 0.11
    # one stream pausing 2 s while the others flow is load, not a stall
    slow = steady + [_stream(0.0, [0.5, 2.5, 2.6])]
    assert longest_silence(slow)[0] < 0.11
    # every stream pausing at once between 1.0 s and 3.0 s
    paused = [_stream(0.0, [0.1, 0.5, 1.0 + 0.01 * i, 3.0, 3.1]) for i in range(4)]
    gap, at = longest_silence(paused)
    assert gap == pytest.approx(1.97) and at == pytest.approx(1.03)
    # the streams' first tokens staggered, their next ones together after the pause (a
    # compile holds every write): the silence runs from the last first token
    held = [_stream(0.0, [0.02 * i, 1.084 + 1e-12 * i, 1.165]) for i in range(1, 5)]
    gap, at = longest_silence(held)
    assert gap == pytest.approx(1.004) and at == pytest.approx(0.08)
    # a wait before a request's first token (queueing, prefill) is not a stall
    queued = [_stream(0.0, [0.1, 0.2]), _stream(0.2, [3.0, 3.1])]
    assert longest_silence(queued)[0] == pytest.approx(0.1)


def test_disturbances_name_compiles_and_stalls():
    paused = [_stream(0.0, [0.1, 0.2, 1.0, 3.0, 3.1]) for _ in range(4)]
    flowing = [_stream(0.0, [0.1 * k for k in range(1, 32)])]
    summary = LevelSummary(4, "closed", 4, 4, {}, 1, 1, 1, 1, 1, 1, {"itl_s": {"p50": 0.1}})
    assert disturbances(summary, paused + flowing, 5, 5) == []  # one stream kept flowing
    found = disturbances(summary, paused, 5, 8)
    assert found[0] == "3 Triton kernels compiled during it"
    assert found[1].startswith("every stream stalled 2.00s at once")
    assert disturbances(summary, [], None, None) == []  # a server that does not count
    # a pause of 2 s is no stall where the usual token gap is 0.5 s (limit: 10 x p50 ITL)
    slow = LevelSummary(4, "closed", 4, 4, {}, 1, 1, 1, 1, 1, 1, {"itl_s": {"p50": 0.5}})
    assert disturbances(slow, paused, 5, 5) == []


async def test_the_binding_names_the_limit_broken_at_the_first_bad_level():
    slo = SLO(ttft_s=2.0, tpot_s=0.05)
    measure, _ = simulated(10, slo)
    b = binding(await search(measure, slo, start=4), slo)
    assert b.bound_by == ["tpot"]
    assert b.text.startswith("stopped at 10: at 11: p95 TTFT 100.0 ms within 2.00 s, p95 TPOT ")
    assert "; at 10: p95 TTFT 100.0 ms within 2.00 s, p95 TPOT 48.8 ms within 50.0 ms" in b.text
    measure, _ = simulated(0, slo)
    b = binding(await search(measure, slo, start=1), slo)
    assert b.bound_by == ["tpot"] and b.text.startswith("no concurrency met the SLOs; at 1: ")
