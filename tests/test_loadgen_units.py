"""Load generator pieces without a server: length specs, SLO and duration parsing,
percentiles, arrival processes and the ramp schedule."""

from __future__ import annotations

import random
import statistics

import pytest

from appliance.loadgen.report import SLO, parse_duration, percentile
from appliance.loadgen.runner import Stage, arrival_gaps
from appliance.loadgen.workload import LengthDist, WorkloadSpec, items


def test_length_specs():
    rng = random.Random(0)
    assert LengthDist.parse("128").sample(rng) == 128
    assert {LengthDist.parse("uniform:3-5").sample(rng) for _ in range(200)} == {3, 4, 5}
    assert min(LengthDist.parse("normal:10,50").sample(rng) for _ in range(200)) == 1
    for bad in ("uniform:9-3", "gauss:1", "x", "uniform:1"):
        with pytest.raises(ValueError):
            LengthDist.parse(bad)


def test_shared_prefix_workload():
    spec = WorkloadSpec(LengthDist.parse("5"), LengthDist.parse("2"), prefix_len=7, seed=1)
    gen = items(spec, list(range(100, 200)))
    a, b = next(gen), next(gen)
    assert a.prompt[:7] == b.prompt[:7] and len(a.prompt) == 12 == a.num_prompt_tokens
    assert a.prompt[7:] != b.prompt[7:] and a.max_tokens == 2 and a.ignore_eos


def test_slo_and_durations():
    slo = SLO.parse("ttft=500ms,tpot=50ms,e2e=2m")
    assert slo.limits() == {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": 120.0}
    assert parse_duration("30m") == 1800 and parse_duration("10s") == 10
    with pytest.raises(ValueError):
        SLO.parse("latency=5ms")


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert [percentile(values, q) for q in (50, 95, 99)] == [50, 95, 99]
    assert percentile([], 50) is None and percentile([3.0], 99) == 3.0


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_arrivals_keep_the_rate_and_burstiness_sets_variance(burstiness):
    gaps = arrival_gaps(10.0, burstiness, random.Random(0))
    sample = [next(gaps) for _ in range(20000)]
    assert statistics.mean(sample) == pytest.approx(0.1, rel=0.05)
    cv = statistics.stdev(sample) / statistics.mean(sample)
    assert cv == pytest.approx(burstiness**-0.5, rel=0.1)


def test_ramp_steps_from_start_to_end():
    stage = Stage("ramp", 2, duration_s=8, ramp_to=8, ramp_steps=4)
    assert [stage.concurrency_at(t) for t in (0, 2.5, 4.5, 7.9, 99)] == [2, 4, 6, 8, 8]
    with pytest.raises(ValueError):
        Stage("closed", 2)


def test_stage_shares_over_client_processes():
    from appliance.loadgen.processes import auto_processes, shares, split_stage

    assert shares(10, 3) == [4, 3, 3] and sum(shares(257, 4)) == 257
    closed = split_stage(Stage("closed", 256, num_requests=512), 4)
    assert [(s.level, s.num_requests) for s in closed] == [(64.0, 128)] * 4
    uneven = split_stage(Stage("closed", 5, num_requests=7, duration_s=9), 2)
    assert [(s.level, s.num_requests, s.duration_s) for s in uneven] == [(3, 4, 9), (2, 3, 9)]
    assert len(split_stage(Stage("closed", 2, duration_s=5), 8)) == 2  # a stream per process
    opened = split_stage(Stage("open", 6.0, num_requests=6), 3)
    assert [(s.level, s.num_requests) for s in opened] == [(2.0, 2)] * 3
    with pytest.raises(ValueError, match="--processes 1"):
        split_stage(Stage("ramp", 1, duration_s=4, ramp_to=8), 2)
    assert auto_processes(1, num_cpus=16) == 1 and auto_processes(64, num_cpus=16) == 1
    assert auto_processes(256, num_cpus=16) == 4 and auto_processes(2048, num_cpus=16) == 8
    assert auto_processes(256, num_cpus=2) == 1


def test_merged_stage_spans_every_process_and_keeps_the_whole_level():
    from appliance.loadgen.client import RequestResult
    from appliance.loadgen.processes import merge
    from appliance.loadgen.runner import StageResult

    stage = Stage("closed", 8, num_requests=3)
    a = StageResult(stage, [RequestResult(4.0, 1.5), RequestResult(4.0, 1.0)], start=1.0, wall_s=2)
    b = StageResult(stage, [RequestResult(4.0, 1.2)], start=1.1, wall_s=2.5)
    merged = merge(stage, [a, b])
    assert [r.start for r in merged.results] == [1.0, 1.2, 1.5]
    assert {r.level for r in merged.results} == {8.0}
    assert merged.start == 1.0 and merged.wall_s == pytest.approx(2.6)
