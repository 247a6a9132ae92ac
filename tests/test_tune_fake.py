"""`appliance tune` end to end against a fake in-process aiohttp server whose per-token delay
grows with the number of requests in flight: it must find the knee and write the profile."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

from aiohttp import web
from aiohttp.test_utils import TestServer
from rich.console import Console

from appliance.loadgen.client import ClientConfig
from appliance.loadgen.report import SLO
from appliance.loadgen.workload import LengthDist, WorkloadSpec
from appliance.tune import load_tuned_profile
from appliance.tune_cmd import _tune, add_tune_parser
from appliance.tune_sweep import parse_sweep

TOKEN_DELAY_S = 0.020  # per request in flight: TPOT = 20 ms x concurrency


def fake_app(token_delay_s: float = TOKEN_DELAY_S) -> web.Application:
    inflight = 0

    async def completions(request: web.Request) -> web.StreamResponse:
        nonlocal inflight
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        inflight += 1
        try:
            for _ in range(body["max_tokens"]):
                await asyncio.sleep(token_delay_s * inflight)
                await resp.write(b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n')
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        finally:
            inflight -= 1
        return resp

    async def tokenize(request: web.Request) -> web.Response:
        return web.json_response({"tokens": [1, 2, 3], "count": 3})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model": "fake",
                "device": "cpu",
                "config": {},
                "queue": {"num_running": inflight, "num_waiting": 0},
                "engine": {"kv_usage_perc": 10.0 * inflight},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/v1/stats", stats)
    return app


async def test_tune_finds_the_knee_and_writes_the_profile(tmp_path):
    server = TestServer(fake_app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    parser = argparse.ArgumentParser()
    add_tune_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "tune",
            "--url",
            url,
            "--slo",
            "tpot=130ms",
            "--input-len",
            "4",
            "--output-len",
            "4",
            "--step-duration",
            "0.3s",
            "--step-requests",
            "12",
            "--soak",
            "1s",
            "--name",
            "fake-cpu",
            "--profile-out",
            str(tmp_path),
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    cfg = ClientConfig(url=url)
    spec = WorkloadSpec(LengthDist.parse("4"), LengthDist.parse("4"))
    console = Console(record=True, width=200)
    try:
        code = await _tune(args, cfg, spec, SLO.parse(args.slo), tmp_path, 0.3, 1.0, console)
    finally:
        await server.close()
    assert code == 0
    prof = load_tuned_profile(tmp_path / "fake-cpu.toml")
    assert prof.max_concurrency == 6  # 120 ms meets 130 ms, 140 ms does not
    assert prof.capacity["first_bad_concurrency"] == 7
    assert prof.slo == {"tpot_s": 0.13, "percentile": 95.0}
    assert prof.model["name"] == "fake" and prof.soak["duration_s"] == 1.0
    probes = json.loads((tmp_path / "tune.json").read_text())["probes"]
    assert [p["concurrency"] for p in probes] == [4, 8, 6, 7]
    assert (tmp_path / "tune_search.png").stat().st_size > 1000
    assert "profile:" in console.export_text()


async def test_sweep_restarts_the_server_per_point_and_keeps_the_best(tmp_path):
    """adaptive batching on: 15 ms per token per request in flight (knee 8 under 130 ms);
    off: 20 ms (knee 6). The winner is the first point, so the soak restarts it."""
    launched: list[dict] = []

    @contextlib.asynccontextmanager
    async def launch(point: dict, index: int):
        launched.append(point)
        server = TestServer(fake_app(0.015 if point["adaptive_batching"] else 0.020))
        await server.start_server()
        try:
            yield str(server.make_url("")).rstrip("/")
        finally:
            await server.close()

    parser = argparse.ArgumentParser()
    add_tune_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "tune",
            "--serve",
            "fake",
            "--sweep",
            "adaptive_batching=on,off",
            "--slo",
            "tpot=130ms",
            "--input-len",
            "4",
            "--output-len",
            "4",
            "--step-duration",
            "0.3s",
            "--step-requests",
            "12",
            "--max-concurrency",
            "10",
            "--soak",
            "1s",
            "--name",
            "fake-sweep",
            "--profile-out",
            str(tmp_path),
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    points = parse_sweep(args.sweep)
    spec = WorkloadSpec(LengthDist.parse("4"), LengthDist.parse("4"))
    console = Console(record=True, width=200)
    code = await _tune(
        args,
        ClientConfig(url="http://unused"),
        spec,
        SLO.parse(args.slo),
        tmp_path,
        0.3,
        1.0,
        console,
        launch,
        points,
    )
    assert code == 0
    assert launched == [
        {"adaptive_batching": True},
        {"adaptive_batching": False},
        {"adaptive_batching": True},
    ]
    prof = load_tuned_profile(tmp_path / "fake-sweep.toml")
    assert prof.chosen["adaptive_batching"] is True and prof.max_concurrency == 8
    report = json.loads((tmp_path / "tune.json").read_text())
    assert [(s["point"]["adaptive_batching"], s["best"]) for s in report["sweep"]] == [
        (True, 8),
        (False, 6),
    ]
    assert (tmp_path / "tune_sweep.png").stat().st_size > 1000
    assert "sweep points" in console.export_text()
