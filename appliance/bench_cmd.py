"""The `appliance bench` and `appliance tune` subcommands: argument parsers and the runs behind
them (drive the server at --url, print a table, write JSON, plots and the tuned profile)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from rich.console import Console

from appliance import tune as tuning
from appliance.loadgen.client import ClientConfig
from appliance.loadgen.report import SLO, parse_duration, summarize, summarize_all, table
from appliance.loadgen.report import write_json as write_bench_json
from appliance.loadgen.runner import Stage
from appliance.loadgen.session import LoadSession
from appliance.loadgen.workload import LengthDist, WorkloadSpec


def _common(p: argparse.ArgumentParser, slo_default: str) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the appliance (only target)")
    p.add_argument("--api-key", default=None, help="bearer key (default: $APPLIANCE_API_KEY)")
    p.add_argument("--model", default=None, help="model name to send (default: the server's)")
    p.add_argument(
        "--input-len",
        default="uniform:64-256",
        help="prompt tokens: N, uniform:LO-HI, normal:MEAN,STD, exp:MEAN",
    )
    p.add_argument("--output-len", default="128", help="tokens to generate (same forms)")
    p.add_argument(
        "--prefix-len",
        type=int,
        default=0,
        help="tokens of a system prompt shared by every request",
    )
    p.add_argument(
        "--jsonl",
        type=Path,
        default=None,
        help='real prompts: lines of {"prompt"|"messages", "max_tokens"}',
    )
    p.add_argument("--slo", default=slo_default, help="latency limits, e.g. ttft=500ms,tpot=50ms")
    p.add_argument("--slo-percentile", type=float, default=95.0)
    p.add_argument("--timeout", default="120s", help="per-request limit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="folder for the JSON and plots")
    p.add_argument("--no-progress", action="store_true")  # fmt: skip


def add_bench_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="load-test a running appliance and report latency/throughput")
    _common(p, "ttft=500ms,tpot=50ms")
    p.add_argument("--mode", choices=("closed", "open", "ramp"), default="closed")
    p.add_argument(
        "--concurrency",
        default="8",
        help="closed loop: one level or a sweep, e.g. 1,2,4,8; ramp: START-END",
    )
    p.add_argument("--rate", default="4", help="open loop req/s: one level or a sweep, 1,2,4")
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="open loop gamma shape: 1 Poisson, <1 burstier, >1 smoother",
    )
    p.add_argument("--ramp-steps", type=int, default=4)
    p.add_argument("--num-requests", type=int, default=None, help="per level")
    p.add_argument("--duration", default="30s", help="per level (a ramp: the whole ramp)")
    return p  # fmt: skip


def add_tune_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("tune", help="find the highest concurrency meeting the SLOs; save a profile")
    _common(p, "ttft=1s,tpot=50ms")
    p.add_argument("--start", type=int, default=4, help="first concurrency (4, or 1)")
    p.add_argument("--max-concurrency", type=int, default=256)
    p.add_argument("--step-duration", default="20s", help="how long each probe runs")
    p.add_argument("--step-requests", type=int, default=None, help="cap on requests per probe")
    p.add_argument(
        "--soak",
        default=None,
        help="hold the best value this long (default 30m on a GPU, 1m on the CPU)",
    )
    p.add_argument("--name", default=None, help="profile name (default: MODEL-GPU)")
    p.add_argument(
        "--profile-out",
        type=Path,
        default=None,
        help="profile .toml path or folder (default profiles/tuned/)",
    )
    return p  # fmt: skip


def _setup(args) -> tuple[ClientConfig, WorkloadSpec, SLO, Path]:
    cfg = ClientConfig(url=args.url.rstrip("/"), model=args.model,
                       api_key=args.api_key or os.environ.get("APPLIANCE_API_KEY") or None,
                       timeout_s=parse_duration(args.timeout))  # fmt: skip
    spec = WorkloadSpec(LengthDist.parse(args.input_len), LengthDist.parse(args.output_len),
                        prefix_len=args.prefix_len, jsonl=args.jsonl, seed=args.seed)  # fmt: skip
    slo = SLO.parse(args.slo, args.slo_percentile)
    out = args.out or Path("bench-results") / time.strftime(f"{args.command}-%Y%m%d-%H%M%S")
    return cfg, spec, slo, out


def _levels(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def bench_stages(args) -> list[Stage]:
    duration = parse_duration(args.duration) if args.duration else None
    common = dict(num_requests=args.num_requests, duration_s=duration)
    if args.mode == "ramp":
        lo, _, hi = args.concurrency.partition("-")
        return [Stage("ramp", float(lo), ramp_to=int(hi or lo), ramp_steps=args.ramp_steps,
                      **common)]  # fmt: skip
    if args.mode == "open":
        return [Stage("open", r, burstiness=args.burstiness, **common) for r in _levels(args.rate)]
    return [Stage("closed", c, **common) for c in _levels(args.concurrency)]


def _console() -> Console:
    console = Console()
    if not console.is_terminal:  # a log or a pipe: no wrapping of the wide table
        console.width = max(console.width, 160)
    return console


def run_bench(args) -> int:
    from appliance.loadgen import plots  # matplotlib loads only when plotting

    console = _console()
    try:
        cfg, spec, slo, out = _setup(args)
        stages = bench_stages(args)
    except ValueError as exc:
        Console(stderr=True).print(f"[red]appliance bench: {exc}")
        return 2
    try:
        session = asyncio.run(_bench(cfg, spec, stages, not args.no_progress))
    except RuntimeError as exc:
        Console(stderr=True).print(f"[red]appliance bench: {exc}")
        return 1
    summaries = summarize_all(session.stages, slo)
    console.print(table(summaries, slo))
    config = {"argv": {k: str(v) for k, v in vars(args).items() if k != "func"},
              "server": vars(session.info)}  # fmt: skip
    write_bench_json(out / "bench.json", config, summaries, session.stages, session.samples)
    paths = plots.bench_plots(summaries, session.results(), session.samples, slo, out)
    console.print(f"JSON: {out / 'bench.json'}")
    console.print("plots: " + ", ".join(str(p) for p in paths))
    return 0 if any(s.num_ok for s in summaries) else 1


async def _bench(cfg, spec, stages, progress) -> LoadSession:
    async with LoadSession(cfg, spec, show_progress=progress) as session:
        for stage in stages:
            await session.run(stage)
    return session


def run_tune(args) -> int:
    console = _console()
    try:
        cfg, spec, slo, out = _setup(args)
        step_s = parse_duration(args.step_duration)
        soak_s = parse_duration(args.soak) if args.soak else None
        if not slo.limits():
            raise ValueError("tune needs at least one latency limit in --slo")
    except ValueError as exc:
        Console(stderr=True).print(f"[red]appliance tune: {exc}")
        return 2
    try:
        return asyncio.run(_tune(args, cfg, spec, slo, out, step_s, soak_s, console))
    except RuntimeError as exc:
        Console(stderr=True).print(f"[red]appliance tune: {exc}")
        return 1


async def _tune(args, cfg, spec, slo, out, step_s, soak_s, console) -> int:
    from appliance.loadgen import plots  # matplotlib loads only when plotting

    async with LoadSession(cfg, spec, console=console,
                           show_progress=not args.no_progress) as session:  # fmt: skip

        async def measure(c: int):
            stage = Stage("closed", c, num_requests=args.step_requests, duration_s=step_s)
            return summarize(await session.run(stage, f"probe concurrency {c}"), slo)

        def report(p: tuning.Probe) -> None:
            verdict = "[green]meets SLO" if p.ok else "[red]" + "; ".join(p.reasons)
            s = p.summary
            console.print(f"probe {p.order}: concurrency {p.concurrency:>4}  {s.num_ok} ok  "
                          f"{s.output_token_throughput:8.1f} tok/s  {verdict}")  # fmt: skip

        result = await tuning.search(measure, slo, args.start, args.max_concurrency, report)
        if result.best is None:
            console.print(f"[red]no concurrency from 1 meets the SLO ({slo.describe()})")
            plots.search_path(result.probes, slo, out / "tune_search.png")
            return 1
        if soak_s is None:
            soak_s = 1800.0 if (session.info.device or "cpu").startswith("cuda") else 60.0
        console.print(f"best concurrency {result.best} (first bad: {result.first_bad}); "
                      f"soaking {soak_s:g}s")  # fmt: skip
        mark = len(session.samples)
        soak_stage = await session.run(Stage("closed", result.best, duration_s=soak_s), "soak")
        soak = summarize(soak_stage, slo)
        drift = tuning.detect_drift(soak_stage.results, session.samples[mark:])
        for reason in tuning.check_slo(soak, slo):
            drift.notes.append(f"soak broke the SLO: {reason}")
    info = session.info
    name = args.name or "-".join(
        x.replace("/", "_").replace(" ", "_") for x in (info.model or "model", info.gpu_name
                                                        or info.device or "unknown"))  # fmt: skip
    workload = {"input_len": args.input_len, "output_len": args.output_len,
                "prefix_len": args.prefix_len, "jsonl": str(args.jsonl or "")}  # fmt: skip
    prof = tuning.build_profile(name, info, result, soak, drift, slo, workload, soak_s)
    path = tuning.write_tuned_profile(prof, args.profile_out)
    summaries = [p.summary for p in sorted(result.probes, key=lambda p: p.concurrency)]
    console.print(table(summaries + [soak], slo, title="appliance tune (probes, then soak)"))
    console.print(("[green]soak stable" if drift.stable else "[yellow]soak drift: ")
                  + "; ".join(drift.notes))  # fmt: skip
    paths = [plots.search_path(result.probes, slo, out / "tune_search.png")]
    paths += plots.bench_plots(summaries, session.results(), session.samples, slo, out)
    (out / "tune.json").write_text(json.dumps(
        {"profile": str(path), "best": result.best, "first_bad": result.first_bad,
         "probes": [{"concurrency": p.concurrency, "ok": p.ok, "reasons": p.reasons}
                    for p in result.probes], "drift_notes": drift.notes}, indent=1))  # fmt: skip
    console.print(f"profile: {path}")
    console.print("plots: " + ", ".join(str(p) for p in paths))
    return 0  # drift is recorded in the profile (soak.stable) and printed above
