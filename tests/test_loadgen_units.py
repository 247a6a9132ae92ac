"""Load generator pieces without a server: length specs, SLO and duration parsing,
percentiles, arrival processes and the ramp schedule, the shared-prefix and multi-turn
workloads, and the per-turn and prefix-cache figures of a report."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest
from rich.console import Console

from appliance.loadgen.client import RequestResult
from appliance.loadgen.load_shapes import Stage, StageResult, arrival_gaps
from appliance.loadgen.report import SLO, parse_duration, percentile, summarize, write_json
from appliance.loadgen.tables import cache_line, turn_ratio_line, turn_table
from appliance.loadgen.workload import (
    WORDS,
    Conversation,
    LengthDist,
    TokenPool,
    WorkloadSpec,
    items,
)


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
    gen = items(spec, TokenPool(list(range(100, 200))))
    a, b = next(gen), next(gen)
    assert a.prompt[:7] == b.prompt[:7] and len(a.prompt) == 12 == a.num_prompt_tokens
    assert a.prompt[7:] != b.prompt[7:] and a.max_tokens == 2 and a.ignore_eos


def test_shared_prefix_is_the_same_in_every_request_of_every_client_process():
    spec = WorkloadSpec(LengthDist.parse("uniform:3-9"), LengthDist.parse("2"), prefix_len=40)
    pool = TokenPool(list(range(100, 200)))
    # Two client processes each draw every other request of the same seeded stream.
    sent = [it for i in range(2) for it in itertools.islice(items(spec, pool), i, 40, 2)]
    prefixes = {tuple(it.prompt[:40]) for it in sent}
    assert len(prefixes) == 1 and len(set(next(iter(prefixes)))) > 10
    assert len({tuple(it.prompt[40:]) for it in sent}) == 40  # each its own question
    assert all(it.messages is None and 3 <= len(it.prompt) - 40 <= 9 for it in sent)


def test_workloads_of_other_shapes_draw_other_tokens_and_the_same_one_repeats():
    pool = TokenPool(list(range(100, 200)))
    shared = WorkloadSpec(LengthDist.parse("16"), LengthDist.parse("8"), prefix_len=384)
    plain = WorkloadSpec(LengthDist.parse("96"), LengthDist.parse("16"))
    first = next(items(plain, pool)).prompt
    assert first[:16] != next(items(shared, pool)).prompt[:16]
    assert (
        next(items(WorkloadSpec(LengthDist.parse("96"), LengthDist.parse("16")), pool)).prompt
        == first
    )
    other_seed = WorkloadSpec(LengthDist.parse("96"), LengthDist.parse("16"), seed=1)
    assert next(items(other_seed, pool)).prompt[:16] != first[:16]


def test_chat_shared_prefix_is_one_system_message_text():
    spec = WorkloadSpec(LengthDist.parse("6"), LengthDist.parse("2"), prefix_len=30, chat=True)
    pool = TokenPool(list(range(100, 200)), tokens_per_word=1.5)
    sent = list(itertools.islice(items(spec, pool), 20))
    systems = {it.messages[0]["content"] for it in sent}
    assert len(systems) == 1 and all(it.messages[0]["role"] == "system" for it in sent)
    assert len(next(iter(systems)).split()) == 20  # 30 tokens at 1.5 tokens a word
    questions = [it.messages[1] for it in sent]
    assert all(q["role"] == "user" and len(q["content"].split()) == 4 for q in questions)
    assert len({q["content"] for q in questions}) == 20
    assert all(set(q["content"].split()) <= set(WORDS) for q in questions)
    assert all(len(it.messages) == 2 and it.prompt is None and it.turn is None for it in sent)
    no_prefix = next(
        items(WorkloadSpec(LengthDist.parse("6"), LengthDist.parse("2"), chat=True), pool)
    )
    assert [m["role"] for m in no_prefix.messages] == ["user"]


def test_workload_flags_that_cannot_go_together(tmp_path):
    rows = tmp_path / "w.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    one = LengthDist.parse("1")
    for bad in (dict(prefix_len=5), dict(chat=True), dict(multi_turn=2)):
        with pytest.raises(ValueError, match="--jsonl"):
            WorkloadSpec(one, one, jsonl=rows, **bad)
    with pytest.raises(ValueError, match="--multi-turn"):
        WorkloadSpec(one, one, multi_turn=-1)
    with pytest.raises(ValueError, match="--multi-turn N"):
        WorkloadSpec(one, one, agent=True)


def test_a_conversation_sends_its_whole_history_with_each_turn():
    spec = WorkloadSpec(
        LengthDist.parse("5"), LengthDist.parse("uniform:3-9"), prefix_len=8, multi_turn=3
    )
    stream = items(spec, TokenPool(list(range(100, 200))))
    conv, other = next(stream), next(stream)
    assert isinstance(conv, Conversation) and (conv.number, other.number) == (0, 1)
    assert conv.system == other.system and conv.questions != other.questions
    sent = []
    while (item := conv.next_item()) is not None:
        sent.append(item)
        conv.add_answer(f"answer {item.turn}")
    assert [(it.conversation, it.turn) for it in sent] == [(0, 1), (0, 2), (0, 3)]
    assert [it.max_tokens for it in sent] == conv.max_tokens and all(it.ignore_eos for it in sent)
    system = {"role": "system", "content": conv.system}
    q = [{"role": "user", "content": text} for text in conv.questions]
    a = [{"role": "assistant", "content": f"answer {k}"} for k in (1, 2)]
    assert sent[0].messages == [system, q[0]]
    assert sent[1].messages == [system, q[0], a[0], q[1]]
    assert sent[2].messages == [system, q[0], a[0], q[1], a[1], q[2]]
    assert conv.num_answered == 3 and len(conv.history) == 6


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
    from appliance.loadgen.load_shapes import StageResult
    from appliance.loadgen.processes import merge

    stage = Stage("closed", 8, num_requests=3)
    a = StageResult(stage, [RequestResult(4.0, 1.5), RequestResult(4.0, 1.0)], start=1.0, wall_s=2)
    b = StageResult(stage, [RequestResult(4.0, 1.2)], start=1.1, wall_s=2.5)
    merged = merge(stage, [a, b])
    assert [r.start for r in merged.results] == [1.0, 1.2, 1.5]
    assert {r.level for r in merged.results} == {8.0}
    assert merged.start == 1.0 and merged.wall_s == pytest.approx(2.6)


def _turn(turn: int, ttft: float, prompt: int, cached: int, ok: bool = True) -> RequestResult:
    r = RequestResult(8.0, 0.1 * turn, ok=ok, ttft_s=ttft, e2e_s=ttft + 1.0, turn=turn)
    r.num_prompt_tokens, r.num_cached_tokens, r.num_output_tokens = prompt, cached, 4
    r.answer = "words the next turn sends"
    return r


def test_per_turn_figures_cache_shares_and_the_turn_ratio(tmp_path):
    results = [_turn(1, t, 100, 0) for t in (0.1, 0.2, 0.3, 0.4)]
    results += [_turn(2, t, 300, 240) for t in (0.2, 0.3, 0.5, 0.6)]
    results += [_turn(2, 9.0, 300, 300, ok=False)]  # a failed turn counts as sent, not in figures
    stage = StageResult(Stage("closed", 8, num_requests=4), results, wall_s=10.0)
    s = summarize(stage, SLO(ttft_s=1.0))
    first, second = s.turns
    assert (first.turn, first.num_ok, first.num_requests) == (1, 4, 4)
    assert (second.turn, second.num_ok, second.num_requests) == (2, 4, 5)
    assert (first.ttft_p50_s, first.ttft_p90_s) == (0.2, 0.4)
    assert (second.ttft_p50_s, second.ttft_p90_s) == (0.3, 0.6)
    assert (first.num_prompt_tokens, first.num_cached_tokens, first.cache_hit_share) == (400, 0, 0)
    assert (second.num_prompt_tokens, second.num_cached_tokens) == (1200, 960)
    assert second.cache_hit_share == 0.8 and second.prompt_tokens_mean == 300
    assert s.num_prompt_tokens == 1600 and s.num_cached_tokens == 960
    assert s.cached_tokens_mean == 120 and s.cache_hit_share == 0.6
    ratio = s.turn_ttft_ratio
    assert (ratio["first_turn"], ratio["last_turn"]) == (1, 2)
    assert ratio["p50"] == pytest.approx(1.5) and ratio["p90"] == pytest.approx(1.5)
    assert turn_ratio_line(s) == "turn 2 / turn 1 TTFT: p50 1.50x, p90 1.50x"
    console = Console(record=True, width=200)
    console.print(turn_table(s))
    shown = console.export_text()
    assert "300.0/600.0" in shown and "960 (80.0%)" in shown and "4/5" in shown
    write_json(tmp_path / "b.json", {}, [s], [stage], [])
    doc = json.loads((tmp_path / "b.json").read_text())
    (js,) = doc["summaries"]
    assert js["cache_hit_share"] == 0.6 and js["cached_tokens_mean"] == 120
    assert (
        js["turn_ttft_ratio"]["p50"] == pytest.approx(1.5)
        and js["turns"][1]["cache_hit_share"] == 0.8
    )
    assert [r["turn"] for r in doc["requests"]] == [1] * 4 + [2] * 5
    assert all("answer" not in r for r in doc["requests"])


def test_single_requests_have_no_turn_figures_and_report_cache_shares():
    results = [_turn(1, 0.1, 100, 50)]
    results[0].turn = None
    s = summarize(StageResult(Stage("closed", 1, num_requests=1), results, wall_s=1.0), SLO())
    assert s.turns == [] and s.turn_ttft_ratio is None and turn_ratio_line(s) is None
    assert s.cached_tokens_mean == 50 and s.cache_hit_share == 0.5
    assert cache_line(s) is None  # the server did not report its counters
    stage = StageResult(Stage("closed", 1, num_requests=1), results, wall_s=1.0)
    stage.server_cache_queries, stage.server_cached_tokens = 400, 300
    counted = summarize(stage, SLO())
    assert counted.server_cache_hit_share == 0.75
    assert cache_line(counted) == (
        "prefix cache at 1 conc: clients' usage 50 of 100 prompt tokens cached (50.0%); "
        "server counters 300 of 400 looked up (75.0%)"
    )
    empty = summarize(StageResult(Stage("closed", 1, num_requests=1), [], wall_s=1.0), SLO())
    assert empty.cached_tokens_mean is None and empty.cache_hit_share is None
