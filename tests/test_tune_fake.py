"""`appliance tune` end to end against a fake in-process aiohttp server whose per-token delay
grows with the number of requests in flight: it must find the knee and write the profile, and
find the same knee when the server compiles kernels (a stall and a count in /v1/stats) the
first time its load reaches a level."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

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


COMPILE_STALL_S = 1.0


def fake_app(
    token_delay_s: float = TOKEN_DELAY_S, compile_at: int | None = None
) -> web.Application:
    """`compile_at`: the first time that many streams in flight have all had their first token,
    the server compiles: every stream waits COMPILE_STALL_S and /v1/stats counts 3 compiles
    after warm-up. (Waiting for the first tokens makes the stall one every started stream
    sees, whatever order the streams' requests arrived in.)"""
    inflight = 0
    started = 0  # streams in flight that have written their first token
    compiles = 0
    stall_until = 0.0

    async def completions(request: web.Request) -> web.StreamResponse:
        nonlocal inflight, started, compiles, stall_until, compile_at
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        inflight += 1
        wrote = False
        try:
            for _ in range(body["max_tokens"]):
                if compile_at is not None and wrote and started >= compile_at:
                    compile_at, compiles = None, compiles + 3
                    stall_until = time.monotonic() + COMPILE_STALL_S
                await asyncio.sleep(token_delay_s * inflight)
                # the stall holds every write, the ones already on their way too
                await asyncio.sleep(max(0.0, stall_until - time.monotonic()))
                await resp.write(b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n')
                if not wrote:
                    wrote, started = True, started + 1
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        finally:
            inflight -= 1
            started -= wrote
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
                "engine": {"kv_usage_perc": 10.0 * inflight, "compiles_after_warmup": compiles},
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


async def _tune_against(app: web.Application, tmp_path, *flags: str) -> tuple[int, str]:
    """Tune against `app` (tpot <= 130 ms, 4-token answers); the exit code and console text."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    parser = argparse.ArgumentParser()
    add_tune_parser(parser.add_subparsers(dest="command"))
    argv = ["tune", "--url", url, "--slo", "tpot=130ms", "--input-len", "4", "--output-len", "4"]
    argv += ["--step-requests", "12", "--name", "fake-cpu", "--no-progress", *flags]
    args = parser.parse_args(argv + ["--profile-out", str(tmp_path), "--out", str(tmp_path)])
    spec = WorkloadSpec(LengthDist.parse("4"), LengthDist.parse("4"))
    console = Console(record=True, width=250)
    try:
        code = await _tune(
            args, ClientConfig(url=url), spec, SLO.parse(args.slo), tmp_path, 5.0, 1.0, console
        )
    finally:
        await server.close()
    return code, console.export_text()


async def test_a_probe_the_server_compiled_during_is_measured_again(tmp_path):
    """Without warm-up waves the compile stall (1 s in every stream) lands in the first probe
    at 4, which then breaks the 130 ms TPOT limit: believed, the search would go below 4. It is
    measured again, and the search finds the knee of the fake (6)."""
    code, text = await _tune_against(
        fake_app(compile_at=4), tmp_path, "--probe-warmup", "0", "--start", "4"
    )
    assert code == 0, text
    report = json.loads((tmp_path / "tune.json").read_text())
    probes = report["probes"]
    assert [p["concurrency"] for p in probes] == [4, 8, 6, 7]
    assert [p["attempts"] for p in probes] == [2, 1, 1, 1]
    assert "3 Triton kernels compiled during it" in probes[0]["discarded"][0]
    assert "every stream stalled" in probes[0]["discarded"][0]
    assert probes[0]["ok"] and probes[0]["disturbances"] == []
    assert report["best"] == 6 and report["bound_by"] == ["tpot"]
    assert report["binding"].startswith("stopped at 6: at 7: p95 TPOT ")
    prof = load_tuned_profile(tmp_path / "fake-cpu.toml")
    assert prof.max_concurrency == 6 and prof.capacity["bound_by"] == "tpot"
    assert "concurrency 4 disturbed" in text and "bound by tpot: stopped at 6" in text


async def test_the_warm_up_wave_takes_the_compile_stall_out_of_the_probe(tmp_path):
    """With the default warm-up wave the same compile happens before the probe's clock
    starts: nothing is repeated and the knee is the same."""
    code, text = await _tune_against(fake_app(compile_at=4), tmp_path, "--start", "4")
    assert code == 0, text
    report = json.loads((tmp_path / "tune.json").read_text())
    assert [(p["concurrency"], p["attempts"]) for p in report["probes"]] == [
        (4, 1),
        (8, 1),
        (6, 1),
        (7, 1),
    ]
    assert report["best"] == 6 and "disturbed" not in text


async def test_the_concurrency_cap_is_named_when_it_bound_the_answer(tmp_path):
    code, text = await _tune_against(fake_app(), tmp_path, "--max-concurrency", "5")
    assert code == 0, text
    report = json.loads((tmp_path / "tune.json").read_text())
    assert report["best"] == 5 and report["bound_by"] == ["max_concurrency"]
    assert "bound by max_concurrency: the concurrency cap bound it: 5 met the SLOs" in text
