"""`appliance bench` against a real `appliance serve` subprocess (embedded model, tiny
max_tokens): closed and open loop, multi-turn conversations, numbers checked against the
server's own usage. The server is the shared one (tests/support/shared_server.py), which
refuses a request without a key: every request here, /tokenize among them, carries one."""

from __future__ import annotations

import argparse
import json

import pytest

from appliance.bench_cmd import add_bench_parser, run_bench
from appliance.loadgen import SLO, ClientConfig, LengthDist, LoadSession, Stage, WorkloadSpec
from appliance.loadgen.report import summarize
from tests.support.shared_server import KEYS


@pytest.fixture
def url(shared_server, monkeypatch):
    monkeypatch.setenv("APPLIANCE_API_KEY", KEYS["bench"])  # for `appliance bench`
    return shared_server.url


def client(url: str, **kw) -> ClientConfig:
    return ClientConfig(url=url, api_key=KEYS["bench"], **kw)


SPEC = WorkloadSpec(LengthDist.parse("uniform:8-24"), LengthDist.parse("uniform:2-6"), prefix_len=8)


def check_consistent(stage) -> None:
    ok = [r for r in stage.results if r.ok]
    assert ok and len(ok) == len(stage.results), [r.error for r in stage.results]
    for r in ok:
        assert r.usage_reported
        assert 0 < r.ttft_s <= r.e2e_s
        assert r.num_chunks <= r.num_output_tokens and len(r.itl_s) == r.num_chunks - 1
        assert 8 + 8 <= r.num_prompt_tokens <= 8 + 24
        assert 2 <= r.num_output_tokens <= 6  # ignore_eos: exactly the asked length
        if r.num_output_tokens > 1:
            assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / (r.num_output_tokens - 1))
    s = summarize(stage, SLO(ttft_s=60.0))
    tokens = sum(r.num_output_tokens for r in ok)
    assert s.output_token_throughput == pytest.approx(tokens / stage.wall_s)
    assert s.request_throughput == pytest.approx(len(ok) / stage.wall_s)
    assert s.goodput_frac == 1.0 and s.errors == {}
    assert s.get("ttft_s", "p50") <= s.get("ttft_s", "p99") <= s.get("e2e_s", "p99")


async def test_closed_and_open_loop_are_consistent(url):
    async with LoadSession(
        client(url), SPEC, show_progress=False, sample_interval_s=0.1
    ) as session:
        closed = await session.run(Stage("closed", 3, num_requests=6, duration_s=30))
        opened = await session.run(Stage("open", 8.0, num_requests=6, duration_s=30))
    check_consistent(closed)
    check_consistent(opened)
    assert session.info.model and session.info.device == "cpu"
    assert session.samples and all(s.kv_usage_perc is not None for s in session.samples)


async def test_errors_are_counted_not_raised(url):
    cfg = client(url, model="no-such-model")
    async with LoadSession(cfg, SPEC, show_progress=False) as session:
        stage = await session.run(Stage("closed", 2, num_requests=4))
    s = summarize(stage, SLO(ttft_s=1.0))
    assert s.num_ok == 0 and s.errors == {"http 404": 4} and s.goodput == 0.0


def test_bench_command_writes_table_json_and_plots(url, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "bench",
            "--url",
            url,
            "--mode",
            "ramp",
            "--concurrency",
            "1-2",
            "--ramp-steps",
            "2",
            "--duration",
            "2s",
            "--input-len",
            "16",
            "--output-len",
            "3",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert run_bench(args) == 0
    shown = capsys.readouterr().out
    assert "appliance bench" in shown and "1 conc" in shown and "2 conc" in shown
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert {s["level"] for s in doc["summaries"]} == {1.0, 2.0}
    assert all(r["num_output_tokens"] == 3 for r in doc["requests"] if r["ok"])
    for name in ("latency_vs_load", "throughput_vs_load", "ttft_tpot_hist", "kv_queue_timeline"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000


def test_bench_without_out_writes_under_the_results_folder_and_says_where(
    url, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("APPLIANCE_RESULTS_DIR", str(tmp_path))
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    argv = ["bench", "--url", url, "--no-progress", "--input-len", "8", "--output-len", "2"]
    assert run_bench(parser.parse_args(argv + ["--num-requests", "2", "--duration", "600s"])) == 0
    (out,) = tmp_path.iterdir()
    assert out.name.startswith("bench-") and (out / "bench.json").is_file()
    assert f"results written to {out}" in capsys.readouterr().out


def _bench_json(url, out, *flags) -> dict:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    argv = ["bench", "--url", url, "--out", str(out), "--no-progress", "--input-len"]
    argv += ["uniform:8-40", "--output-len", "3", "--concurrency", "4", "--num-requests", "8"]
    assert run_bench(parser.parse_args(argv + list(flags))) == 0
    return json.loads((out / "bench.json").read_text())


def test_two_client_processes_send_the_same_requests_and_match_the_server(url, tmp_path, capsys):
    one = _bench_json(url, tmp_path / "one", "--processes", "1")
    two = _bench_json(url, tmp_path / "two", "--processes", "2")
    assert (one["config"]["client_processes"], two["config"]["client_processes"]) == (1, 2)
    # Each process draws every other request of the one seeded stream: together, the same 8.
    lengths = [sorted(r["num_prompt_tokens"] for r in d["requests"]) for d in (one, two)]
    assert lengths[0] == lengths[1] and len(set(lengths[0])) > 1
    for doc in (one, two):
        (s,) = doc["summaries"]
        assert s["level"] == 4.0 and s["num_ok"] == 8 and s["num_output_tokens"] == 8 * 3
        assert s["server_output_tokens"] == 8 * 3 and s["server_ratio"] == 1.0
        assert {r["level"] for r in doc["requests"]} == {4.0}
    assert "24 / 24 (1.000)" in capsys.readouterr().out


def test_multi_turn_conversations_report_each_turn(url, tmp_path, capsys):
    flags = ["--multi-turn", "3", "--prefix-len", "16", "--output-len", "4"]
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    argv = ["bench", "--url", url, "--out", str(tmp_path), "--no-progress", "--input-len", "8"]
    argv += ["--concurrency", "2", "--num-requests", "3", "--duration", "600s", *flags]
    assert run_bench(parser.parse_args(argv)) == 0
    shown = capsys.readouterr().out
    assert "per turn at 2 conversations" in shown and "turn 3 / turn 1 TTFT: p50 " in shown
    doc = json.loads((tmp_path / "bench.json").read_text())
    (s,) = doc["summaries"]
    assert [(t["turn"], t["num_ok"]) for t in s["turns"]] == [(1, 3), (2, 3), (3, 3)], s["errors"]
    assert s["num_ok"] == 9 and s["server_output_tokens"] == 9 * 4
    assert s["turn_ttft_ratio"]["last_turn"] == 3 and s["turn_ttft_ratio"]["p50"] > 0
    rows = doc["requests"]
    assert sorted({r["conversation"] for r in rows}) == [0, 1, 2]
    for n in range(3):
        turns = sorted((r for r in rows if r["conversation"] == n), key=lambda r: r["turn"])
        assert [r["turn"] for r in turns] == [1, 2, 3]
        for earlier, later in zip(turns, turns[1:]):
            # the history grew by the answer (4 tokens) and a new 8-word question
            assert later["num_prompt_tokens"] >= earlier["num_prompt_tokens"] + 4 + 8
        for r in turns:
            assert (
                r["num_output_tokens"] == 4
                and 0 <= r["num_cached_tokens"] <= r["num_prompt_tokens"]
            )
    assert s["num_prompt_tokens"] == sum(r["num_prompt_tokens"] for r in rows)
    assert s["num_cached_tokens"] == sum(r["num_cached_tokens"] for r in rows)
    if doc["config"]["server"]["prefix_caching"]:  # a server that keeps a prefix cache
        assert s["server_cached_tokens"] == s["num_cached_tokens"]
        assert all(t["num_cached_tokens"] > 0 for t in s["turns"][1:])  # the history hits


def test_a_shared_prefix_is_counted_from_the_usage(url, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    argv = ["bench", "--url", url, "--out", str(tmp_path), "--no-progress", "--seed", "7"]
    argv += ["--prefix-len", "64", "--input-len", "8", "--output-len", "2", "--concurrency", "1"]
    assert run_bench(parser.parse_args(argv + ["--num-requests", "3", "--duration", "600s"])) == 0
    doc = json.loads((tmp_path / "bench.json").read_text())
    (s,) = doc["summaries"]
    rows = doc["requests"]
    assert s["num_ok"] == 3 and all(r["num_prompt_tokens"] == 72 for r in rows)
    assert s["num_cached_tokens"] == sum(r["num_cached_tokens"] for r in rows)
    assert s["cache_hit_share"] == s["num_cached_tokens"] / (3 * 72)
    assert "prompt/cached tok/req" in capsys.readouterr().out
    if doc["config"]["server"]["prefix_caching"]:  # one at a time: the later two find the prefix
        assert [r["num_cached_tokens"] >= 64 for r in rows] == [False, True, True]
        assert s["server_cached_tokens"] == s["num_cached_tokens"]


def test_an_agent_s_turns_carry_tools_and_hit_the_prefix_cache(url, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    argv = ["bench", "--url", url, "--out", str(tmp_path), "--no-progress", "--agent"]
    argv += ["--multi-turn", "3", "--prefix-len", "24", "--input-len", "8", "--output-len", "4"]
    argv += ["--concurrency", "2", "--num-requests", "2", "--duration", "600s"]
    assert run_bench(parser.parse_args(argv)) == 0
    assert "turn 3 / turn 1 TTFT: p50 " in capsys.readouterr().out
    doc = json.loads((tmp_path / "bench.json").read_text())
    (s,) = doc["summaries"]
    assert [(t["turn"], t["num_ok"]) for t in s["turns"]] == [(1, 2), (2, 2), (3, 2)], s["errors"]
    rows = sorted(doc["requests"], key=lambda r: (r["conversation"], r["turn"]))
    for earlier, later in zip(rows, rows[1:]):
        if later["conversation"] == earlier["conversation"]:
            # the history grew by the reply, its call and the call's 8-word result
            assert later["num_prompt_tokens"] >= earlier["num_prompt_tokens"] + 4 + 8
    if doc["config"]["server"]["prefix_caching"]:
        assert all(t["num_cached_tokens"] > 0 for t in s["turns"][1:])  # the history hits
