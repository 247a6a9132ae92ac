"""`appliance soak`'s pure parts: each failure rule fires on a drifting or leaking series and not
on a flat one, the ledger finds lost requests, the client classifies how a request ended, and
the report is written (JSON and PNGs)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from appliance.cli import build_parser, main
from appliance.soak.cmd import span
from appliance.soak.intervals import held_in_metrics
from appliance.soak.load import Client, LoadConfig, Recorder
from appliance.soak.report import write_report
from appliance.soak.rules import (
    DRIFT_RULES,
    LATENCY_DRIFT_LIMIT,
    MEMORY_DRIFT_LIMIT,
    Interval,
    Ledger,
    summary_table,
    verdict,
)

MIB = 2**20


def rows(num: int = 5, interval_s: float = 60.0, **series) -> list[dict]:
    """Interval figures, flat unless a keyword gives a series a list of values."""
    flat = {
        "rss_bytes": 2000 * MIB,
        "gpu_memory_bytes": 70000 * MIB,
        "ttft_p99": 0.200,
        "tpot_p99": 0.020,
        "ttft_p50": 0.100,
        "tpot_p50": 0.015,
        "num_streams": 100,
        "kv_blocks_idle": 0,
        "inflight_idle": 0,
        "endings": {"completed": 100},
    }
    out = []
    for i in range(num):
        row = {"index": i, "t_start": i * interval_s, "t_end": (i + 1) * interval_s, **flat}
        row |= {k: v[i] for k, v in series.items()}
        out.append(row)
    return out


def clean_ledger() -> Ledger:
    ledger = Ledger()
    for kind, ending in (("chat", "completed"), ("storm", "rejected"), ("abort", "aborted")):
        ledger.send(kind)
        ledger.end(kind, ending)
    return ledger


def test_flat_run_passes():
    assert verdict(rows(), clean_ledger(), warmup_s=60) == []


@pytest.mark.parametrize(("key", "limit"), DRIFT_RULES)
def test_each_drift_rule_fires_on_a_rise_past_its_limit(key, limit):
    base = rows()[0][key]
    rising = [base * (1 + limit * 2 * i / 4) for i in range(5)]  # ends at 2x the limit
    reasons = verdict(rows(**{key: rising}), clean_ledger(), warmup_s=0)
    assert (
        len(reasons) == 1 and reasons[0].startswith(f"{key} rose 2") and "interval 4" in reasons[0]
    )
    within = [base * (1 + limit * 0.9 * i / 4) for i in range(5)]
    assert verdict(rows(**{key: within}), clean_ledger(), warmup_s=0) == []


def test_drift_is_measured_from_the_first_interval_after_warm_up():
    rss = [1000 * MIB, 1900 * MIB, 2000 * MIB, 2000 * MIB, 2005 * MIB]  # +0.25% after warm-up
    assert verdict(rows(rss_bytes=rss), clean_ledger(), warmup_s=120) == []
    reasons = verdict(rows(rss_bytes=rss), clean_ledger(), warmup_s=0)
    assert reasons and reasons[0].startswith("rss_bytes rose 100.5%")


def test_the_baseline_waits_until_the_servers_request_records_are_full():
    # the server keeps its last 1,000 requests: RSS steps up until the soak has sent that many
    rss = [2300 * MIB, 2300 * MIB, 2330 * MIB, 2331 * MIB, 2331 * MIB]
    data = rows(rss_bytes=rss)
    for i, row in enumerate(data):
        row["num_sent_before"] = 500 * i
    reasons = verdict(data, clean_ledger(), warmup_s=60)
    assert reasons and reasons[0].startswith("rss_bytes rose 1.3%")  # from interval 1
    assert verdict(data, clean_ledger(), warmup_s=60, fill_requests=1000) == []  # from 2
    short = verdict(data, clean_ledger(), warmup_s=60, fill_requests=2000)
    assert short[0].startswith("too short") and "after 2000 requests" in short[0]


def test_a_fall_and_a_missing_series_are_no_drift():
    falling = [0.3, 0.28, 0.25, 0.22, 0.2]
    assert verdict(rows(ttft_p99=falling), clean_ledger(), 0) == []
    assert verdict(rows(gpu_memory_bytes=[None] * 5), clean_ledger(), 0) == []


def test_limits_are_one_and_ten_percent():
    assert (MEMORY_DRIFT_LIMIT, LATENCY_DRIFT_LIMIT) == (0.01, 0.10)
    rss = [1000 * MIB, 1000 * MIB, 1000 * MIB, 1000 * MIB, 1011 * MIB]
    assert verdict(rows(rss_bytes=rss), clean_ledger(), 0)[0].startswith("rss_bytes rose 1.1%")


def test_a_run_too_short_to_compare_fails():
    reasons = verdict(rows(num=3), clean_ledger(), warmup_s=150)
    assert len(reasons) == 1 and reasons[0].startswith("too short")


def test_kv_blocks_or_requests_held_at_idle_fail():
    leaked = verdict(rows(kv_blocks_idle=[0, 0, 3, 0, 0]), clean_ledger(), 0)
    assert leaked == ["interval 2: 3 KV blocks held at idle"]
    unknown = verdict(rows(kv_blocks_idle=[0, 0, 0, 0, None]), clean_ledger(), 0)
    assert unknown == ["interval 4: no KV block reading at idle"]
    held = verdict(rows(inflight_idle=[0, 1, 0, 0, 0]), clean_ledger(), 0)
    assert held == ["interval 1: 1 requests held at idle"]


def test_a_5xx_fails_and_a_429_or_400_does_not():
    ledger = clean_ledger()
    for ending in ("rejected", "bad_request"):
        ledger.send("malformed" if ending == "bad_request" else "storm")
        ledger.end("malformed" if ending == "bad_request" else "storm", ending)
    assert verdict(rows(), ledger, 0) == []
    ledger.send("chat")
    ledger.end("chat", "http_5xx")
    assert verdict(rows(), ledger, 0) == ["1 answers with a 5xx status"]


def test_a_malformed_body_that_is_not_refused_fails():
    ledger = clean_ledger()
    ledger.send("malformed")
    ledger.end("malformed", "completed")
    assert verdict(rows(), ledger, 0)[0].startswith("1 malformed requests not refused with 400")


def test_ledger_counts_requests_sent_and_never_ended_and_lost_endings():
    ledger = clean_ledger()
    assert ledger.lost() == {}
    ledger.send("chat_stream")  # never ends
    for ending in ("timeout", "truncated", "error_event", "disconnected"):
        ledger.send("disconnect")
        ledger.end("disconnect", ending)
    assert ledger.lost() == {"chat_stream": 1, "disconnect": 2}
    reasons = verdict(rows(), ledger, 0)
    assert "1 chat_stream requests lost (sent 1, ended {})" in reasons
    assert any(r.startswith("2 disconnect requests lost (sent 4") for r in reasons)
    with pytest.raises(ValueError, match="unknown request kind"):
        ledger.send("bogus")
    with pytest.raises(ValueError, match="unknown ending"):
        ledger.end("chat", "vanished")


def test_interval_percentiles_and_table():
    interval = Interval(0, 0.0, 60.0, ttft_s=[0.1 * i for i in range(1, 101)], rss_bytes=MIB)
    stats = interval.stats()
    assert stats["ttft_p50"] == pytest.approx(5.0) and stats["ttft_p99"] == pytest.approx(9.9)
    assert stats["tpot_p99"] is None and stats["num_streams"] == 100
    table = summary_table([stats])
    assert "| 0 | 60 | 100 | 5000.0 | 9900.0 | n/a | n/a | 1.0 | n/a | n/a |" in table


def test_report_writes_json_and_plots(tmp_path):
    data = rows(rss_bytes=[2000 * MIB, 2000 * MIB, 2000 * MIB, 2000 * MIB, 2100 * MIB])
    ledger = clean_ledger()
    reasons = verdict(data, ledger, 0)
    paths = write_report(tmp_path, {"duration": 300}, data, ledger, reasons)
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert doc["passed"] is False and doc["reasons"] == reasons
    assert doc["intervals"] == data and doc["requests"]["sent"] == {
        "chat": 1,
        "storm": 1,
        "abort": 1,
    }
    pngs = [p for p in paths if p.suffix == ".png"]
    assert {p.name for p in pngs} == {"memory.png", "latency.png", "idle.png", "endings.png"}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)


async def fake_server(handler) -> TestServer:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app)
    await server.start_server()
    return server


def sse(*chunks: dict | str) -> bytes:
    return b"".join(
        f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks
    )


TOKEN = {"choices": [{"index": 0, "text": "x"}]}
USAGE = {"choices": [], "usage": {"completion_tokens": 4}}


@pytest.mark.parametrize(
    ("answer", "kind", "ending"),
    [
        ("stream", "completion_stream", "completed"),
        ("stream", "disconnect", "disconnected"),
        ("short", "completion_stream", "truncated"),
        ("error", "completion_stream", "error_event"),
        ("json", "completion", "completed"),
        ("empty", "completion", "truncated"),
        (429, "storm", "rejected"),
        (400, "malformed", "bad_request"),
        (404, "chat", "http_4xx"),
        (503, "chat", "http_5xx"),
    ],
)
async def test_client_names_how_each_request_ended(answer, kind, ending):
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        if isinstance(answer, int):
            return web.json_response({"error": {"message": "no"}}, status=answer)
        if answer in ("json", "empty"):
            return web.json_response({"choices": [{"text": "hi"}] if answer == "json" else []})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if answer == "error":
            await resp.write(sse({"error": {"message": "timed out"}}, "[DONE]"))
        else:
            await resp.write(sse(TOKEN, TOKEN, TOKEN, TOKEN))
            if answer == "stream":
                await resp.write(sse(USAGE, "[DONE]"))
        return resp

    server = await fake_server(handler)
    try:
        async with aiohttp.ClientSession() as session:
            cfg = LoadConfig(str(server.make_url("")).rstrip("/"), ["k1", None], 1, 4)
            rec = Recorder(interval=Interval(0, 0.0, 0.0))
            client = Client(session, cfg, rec)
            body = {"prompt": "hi", "stream": kind.endswith("stream") or kind == "disconnect"}
            await client.send(kind, body)
    finally:
        await server.close()
    assert rec.ledger.ended == {kind: {ending: 1}} and rec.interval.endings == {ending: 1}
    timed = answer == "stream" and kind == "completion_stream"
    assert len(rec.interval.ttft_s) == len(rec.interval.tpot_s) == int(timed)


async def test_abort_storm_ends_every_request_as_aborted():
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(TOKEN))
        await asyncio.Event().wait()  # never set: only the client's cancel ends it
        return resp

    server = await fake_server(handler)
    try:
        async with aiohttp.ClientSession() as session:
            cfg = LoadConfig(str(server.make_url("")).rstrip("/"), [None], 1, 4)
            rec = Recorder(interval=Interval(0, 0.0, 0.0))
            await Client(session, cfg, rec).abort_storm(random.Random(0), 5)
    finally:
        await server.close()
    assert rec.ledger.sent == {"abort": 5} and rec.ledger.ended == {"abort": {"aborted": 5}}
    assert rec.ledger.lost() == {}


def test_requests_held_are_read_from_metrics():
    page = (
        'vllm:num_requests_running{model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{model_name="m"} 1.0\n'
        "appliance:requests_in_flight 1.0\n"
    )
    assert held_in_metrics(page) == 3
    assert held_in_metrics("appliance:requests_in_flight 4.0\n") == 4
    assert held_in_metrics("other_metric 1.0\n") is None


def test_ranges_on_the_command_line():
    assert span("16-64") == (16, 64) and span("8") == (8, 8)
    for bad in ("64-16", "0-4", "a-b"):
        with pytest.raises(argparse.ArgumentTypeError, match="bad range"):
            span(bad)


def test_appliance_soak_takes_its_flags_and_refuses_a_run_shorter_than_an_interval(capsys):
    args = build_parser().parse_args(
        ["soak", "--url", "http://127.0.0.1:9", "--duration", "10s", "--interval", "5s"]
    )
    assert (args.command, args.duration, args.interval, args.max_tokens) == (
        "soak",
        10,
        5,
        (16, 64),
    )
    assert (
        main(["soak", "--url", "http://127.0.0.1:9", "--duration", "1s", "--interval", "5s"]) == 2
    )
    assert "--duration at least one --interval" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --url or --serve is required
        build_parser().parse_args(["soak", "--duration", "10s"])


@pytest.mark.parametrize("num_storms", [0, 1, 2])
async def test_a_stream_that_overlaps_a_429_storm_is_not_timed(num_storms):
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(TOKEN, TOKEN))
        rec.num_storms += num_storms == 2  # a storm began while the stream ran
        await resp.write(sse(TOKEN, USAGE, "[DONE]"))
        return resp

    server = await fake_server(handler)
    rec = Recorder(interval=Interval(0, 0.0, 0.0), num_storms=min(num_storms, 1))
    try:
        async with aiohttp.ClientSession() as session:
            cfg = LoadConfig(str(server.make_url("")).rstrip("/"), [None], 1, 4)
            await Client(session, cfg, rec).send("chat_stream", {"prompt": "hi", "stream": True})
    finally:
        await server.close()
    assert rec.ledger.ended == {"chat_stream": {"completed": 1}}
    assert len(rec.interval.ttft_s) == len(rec.interval.tpot_s) == int(num_storms == 0)
