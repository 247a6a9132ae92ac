"""The `appliance bench` subcommand: its argument parser and run (drive the server at --url with
single requests or multi-turn conversations, print the tables, write JSON and plots); the flags
and setup it shares with `appliance tune`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import time
from pathlib import Path

from rich.console import Console

from appliance.loadgen.agent import AGENT_SYSTEM_TOKENS, AGENT_TURNS
from appliance.loadgen.client import ClientConfig
from appliance.loadgen.load_shapes import Stage
from appliance.loadgen.processes import STREAMS_PER_PROCESS, auto_processes
from appliance.loadgen.report import SLO, parse_duration, summarize_all
from appliance.loadgen.report import write_json as write_bench_json
from appliance.loadgen.session import LoadSession
from appliance.loadgen.tables import cache_line, table, turn_ratio_line, turn_table
from appliance.loadgen.workload import LengthDist, WorkloadSpec

RESULTS_ENV = "APPLIANCE_RESULTS_DIR"
"""Environment variable naming where bench and tune write their results when --out is not
given (default: platformdirs' user data folder for llm-appliance, then results/)."""


def default_results_root() -> Path:
    """$APPLIANCE_RESULTS_DIR, else the user's data folder + results (on Linux
    ~/.local/share/llm-appliance/results, or under $XDG_DATA_HOME): never the current folder."""
    env = os.environ.get(RESULTS_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_path

    return user_data_path("llm-appliance") / "results"


def _common(p: argparse.ArgumentParser, slo_default: str) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the appliance (only target)")
    p.add_argument("--api-key", default=None, help="bearer key (default: $APPLIANCE_API_KEY)")
    p.add_argument("--model", default=None, help="model name to send (default: the server's)")
    p.add_argument(
        "--input-len",
        default="uniform:64-256",
        help="prompt tokens after the shared prefix (multi-turn: each question's): N, "
        "uniform:LO-HI, normal:MEAN,STD, exp:MEAN",
    )
    p.add_argument(
        "--output-len",
        default="128",
        help="tokens to generate, EOS ignored (multi-turn: each answer's; same forms)",
    )
    p.add_argument(
        "--prefix-len",
        type=int,
        default=0,
        help="tokens of a system prompt shared by every request: the same token ids ahead of "
        "each prompt (with --chat or --multi-turn: the same system message text)",
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
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the JSON and plots (default: a new folder under $APPLIANCE_RESULTS_DIR, "
        "else the user's data folder, e.g. ~/.local/share/llm-appliance/results)",
    )
    p.add_argument("--no-progress", action="store_true")


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
    p.add_argument(
        "--chat",
        action="store_true",
        help="send synthetic requests as chat messages on /v1/chat/completions (default: "
        "token-id prompts on /v1/completions)",
    )
    p.add_argument(
        "--multi-turn",
        type=int,
        default=0,
        metavar="N",
        help="N-turn chat conversations: each turn sends the whole history (every earlier "
        "question and its answer) plus a new question; --concurrency, --rate and "
        "--num-requests count conversations",
    )
    p.add_argument(
        "--agent",
        action="store_true",
        help="a coding agent's conversations: a system prompt of --prefix-len tokens (default "
        f"{AGENT_SYSTEM_TOKENS}) and an agent's four tools in every request, then --multi-turn "
        f"turns (default {AGENT_TURNS}), each after the first the result (--input-len tokens) "
        "of a tool call the previous reply made; the per-turn table shows whether TTFT stays "
        "flat as the history grows",
    )
    p.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="per level (with --multi-turn: conversations)",
    )
    p.add_argument("--duration", default="30s", help="per level (a ramp: the whole ramp)")
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="client processes sharing each level's load evenly (default: one per "
        f"{STREAMS_PER_PROCESS} streams of the highest closed-loop level, at most half the "
        "CPUs; a ramp or open loop: 1)",
    )
    return p


def _setup(args) -> tuple[ClientConfig, WorkloadSpec, SLO, Path]:
    cfg = ClientConfig(
        url=args.url.rstrip("/"),
        model=args.model,
        api_key=args.api_key or os.environ.get("APPLIANCE_API_KEY") or None,
        timeout_s=parse_duration(args.timeout),
    )
    spec = WorkloadSpec(
        LengthDist.parse(args.input_len),
        LengthDist.parse(args.output_len),
        prefix_len=args.prefix_len,
        jsonl=args.jsonl,
        seed=args.seed,
    )
    slo = SLO.parse(args.slo, args.slo_percentile)
    out = args.out or default_results_root() / time.strftime(f"{args.command}-%Y%m%d-%H%M%S")
    return cfg, spec, slo, out


def _levels(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def bench_stages(args) -> list[Stage]:
    duration = parse_duration(args.duration) if args.duration else None
    common = dict(num_requests=args.num_requests, duration_s=duration)
    if args.mode == "ramp":
        lo, _, hi = args.concurrency.partition("-")
        return [
            Stage("ramp", float(lo), ramp_to=int(hi or lo), ramp_steps=args.ramp_steps, **common)
        ]
    if args.mode == "open":
        return [Stage("open", r, burstiness=args.burstiness, **common) for r in _levels(args.rate)]
    return [Stage("closed", c, **common) for c in _levels(args.concurrency)]


def num_processes(args, stages: list[Stage]) -> int:
    """--processes, or the count chosen for the highest closed-loop concurrency."""
    if args.processes is not None:
        if args.processes < 1:
            raise ValueError(f"--processes must be >= 1, got {args.processes}")
        if args.processes > 1 and args.mode == "ramp":
            raise ValueError("a ramp runs in one client process: drop --processes")
        return args.processes
    closed = [int(s.level) for s in stages if s.mode == "closed"]
    return auto_processes(max(closed)) if closed else 1


def _console() -> Console:
    console = Console()
    if not console.is_terminal:  # a log or a pipe: no wrapping of the wide table
        console.width = max(console.width, 200)
    return console


def run_bench(args) -> int:
    from appliance.loadgen import plots  # matplotlib loads only when plotting

    console = _console()
    try:
        cfg, spec, slo, out = _setup(args)
        spec = dataclasses.replace(spec, chat=args.chat, multi_turn=args.multi_turn)
        if args.agent:
            spec = dataclasses.replace(
                spec,
                agent=True,
                multi_turn=args.multi_turn or AGENT_TURNS,
                prefix_len=args.prefix_len or AGENT_SYSTEM_TOKENS,
            )
        stages = bench_stages(args)
        processes = num_processes(args, stages)
    except ValueError as exc:
        Console(stderr=True).print(f"[red]appliance bench: {exc}")
        return 2
    console.print(f"results go to {out}", highlight=False, soft_wrap=True)
    try:
        session = asyncio.run(_bench(cfg, spec, stages, not args.no_progress, processes))
    except RuntimeError as exc:
        Console(stderr=True).print(f"[red]appliance bench: {exc}")
        return 1
    summaries = summarize_all(session.stages, slo)
    console.print(table(summaries, slo))
    for s in summaries:
        if line := cache_line(s):
            console.print(line)
        if s.turns:
            console.print(turn_table(s))
        if line := turn_ratio_line(s):
            console.print(line)
    config = {
        "argv": {k: str(v) for k, v in vars(args).items() if k != "func"},
        "server": vars(session.info),
        "client_processes": processes,
    }
    write_bench_json(out / "bench.json", config, summaries, session.stages, session.samples)
    paths = plots.bench_plots(summaries, session.results(), session.samples, slo, out)
    console.print(f"results written to {out}:", highlight=False, soft_wrap=True)
    console.print(f"JSON: {out / 'bench.json'}", highlight=False, soft_wrap=True)
    console.print("plots: " + ", ".join(str(p) for p in paths), highlight=False, soft_wrap=True)
    return 0 if any(s.num_ok for s in summaries) else 1


async def _bench(cfg, spec, stages, progress, processes: int = 1) -> LoadSession:
    async with LoadSession(cfg, spec, show_progress=progress, num_processes=processes) as session:
        for stage in stages:
            await session.run(stage)
    return session
