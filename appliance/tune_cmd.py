"""The `appliance tune` subcommand: search the highest concurrency meeting the SLOs against a
running server (--url) or against servers it starts itself (--serve MODEL), one per point of an
engine-setting sweep; soak the best, print and plot the search, write the tuned profile."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import shlex
from pathlib import Path

from rich.console import Console

from appliance import tune as tuning
from appliance import tune_probe, tune_sweep
from appliance.bench_cmd import _common, _console, _setup
from appliance.loadgen.load_shapes import Stage
from appliance.loadgen.report import parse_duration, summarize
from appliance.loadgen.session import LoadSession
from appliance.loadgen.tables import table
from appliance.settings import TUNABLE


def add_tune_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("tune", help="find the highest concurrency meeting the SLOs; save a profile")
    _common(p, "ttft=1s,tpot=50ms")
    p.add_argument("--start", type=int, default=4, help="first concurrency (4, or 1)")
    p.add_argument("--max-concurrency", type=int, default=256)
    p.add_argument(
        "--resolution",
        type=float,
        default=0.0,
        help="stop the binary search within this share of the best (0: exact)",
    )
    p.add_argument("--step-duration", default="20s", help="how long each probe runs")
    p.add_argument("--step-requests", type=int, default=None, help="cap on requests per probe")
    p.add_argument(
        "--probe-warmup",
        type=float,
        default=1.0,
        metavar="WAVES",
        help="before each probe, send WAVES x its concurrency requests at that concurrency, "
        "not measured (0: none)",
    )
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
    p.add_argument(
        "--serve",
        metavar="MODEL",
        default=None,
        help="start `appliance serve --model MODEL` itself ('embedded': the default "
        "model), restarted for every sweep point; --url is then ignored",
    )
    p.add_argument(
        "--serve-args",
        default="",
        metavar="FLAGS",
        help="more `appliance serve` flags, quoted: '--device cuda --enforce-eager'",
    )
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=A,B",
        help="with --serve: try every combination, e.g. max_num_seqs=64,128 "
        f"adaptive_batching=off,on ({', '.join(TUNABLE)})",
    )
    p.add_argument("--startup-timeout", default="15m", help="with --serve: wait this long for it")
    return p


def run_tune(args) -> int:
    console = _console()
    try:
        cfg, spec, slo, out = _setup(args)
        step_s = parse_duration(args.step_duration)
        soak_s = parse_duration(args.soak) if args.soak else None
        if not slo.limits():
            raise ValueError("tune needs at least one latency limit in --slo")
        if not args.probe_warmup >= 0:
            raise ValueError(f"--probe-warmup {args.probe_warmup:g}: use 0 or more waves")
        if args.sweep and not args.serve:
            raise ValueError("--sweep needs --serve MODEL (tune restarts the server per point)")
        points = tune_sweep.parse_sweep(args.sweep) if args.sweep else [{}]
        serve_args = shlex.split(args.serve_args)
        for name in points[0]:
            if "--" + name.replace("_", "-") in serve_args:
                raise ValueError(f"--serve-args sets {name}, which --sweep varies")
    except ValueError as exc:
        Console(stderr=True).print(f"[red]appliance tune: {exc}")
        return 2
    console.print(f"results go to {out}", highlight=False, soft_wrap=True)
    try:
        if args.serve is None:
            return asyncio.run(_tune(args, cfg, spec, slo, out, step_s, soak_s, console))
        timeout_s = parse_duration(args.startup_timeout)

        def launch(point: dict, index: int):
            log = out / "servers" / f"serve-{index}.log"
            return tune_sweep.serve_process(args.serve, serve_args, point, log, timeout_s)

        return asyncio.run(
            _tune(args, cfg, spec, slo, out, step_s, soak_s, console, launch, points)
        )
    except RuntimeError as exc:
        Console(stderr=True).print(f"[red]appliance tune: {exc}")
        return 1


async def _tune(
    args,
    cfg,
    spec,
    slo,
    out,
    step_s,
    soak_s,
    console,
    launch=None,
    points: list[dict] | None = None,
) -> int:
    """Search every point (one point, the server at cfg.url, without `launch`), soak the best
    and write the profile. `launch(point, index)` is an async context manager yielding a URL."""
    from appliance.loadgen import plots  # matplotlib loads only when plotting

    points = points or [{}]
    if launch is None:
        launch = _fixed_url(cfg.url)

    async def warm_up(session: LoadSession, c: int) -> None:
        """A wave at concurrency c that is not measured: the kernels and batch shapes of c are
        built before the probe's clock starts."""
        if args.probe_warmup > 0:
            n = math.ceil(args.probe_warmup * c)
            stage = Stage("closed", c, num_requests=n, duration_s=step_s)
            await session.run(stage, f"warm-up wave at {c} (not measured)")

    async def measured_search(session: LoadSession) -> tuning.SearchResult:
        async def measure(c: int) -> tuning.Measured:
            await warm_up(session, c)
            before = tune_probe.compiles_reported(await session.stats())
            stage = Stage("closed", c, num_requests=args.step_requests, duration_s=step_s)
            ran = await session.run(stage, f"probe concurrency {c}")
            after = tune_probe.compiles_reported(await session.stats())
            summary = summarize(ran, slo)
            found = tune_probe.disturbances(summary, ran.results, before, after)
            if found:
                console.print(f"[yellow]concurrency {c} disturbed: {'; '.join(found)}")
            return tuning.Measured(summary, found)

        def report(p: tuning.Probe) -> None:
            verdict = "[green]meets SLO" if p.ok else "[red]" + "; ".join(p.reasons)
            s = p.summary
            tries = f"  (try {p.attempts}" if p.discarded else ""
            if p.discarded:
                tries += "; believed though disturbed)" if p.disturbances else ")"
            console.print(
                f"probe {p.order}: concurrency {p.concurrency:>4}  {s.num_ok} ok  "
                f"{s.output_token_throughput:8.1f} tok/s  {verdict}{tries}"
            )

        return await tuning.search(
            measure, slo, args.start, args.max_concurrency, report, getattr(args, "resolution", 0.0)
        )

    rows: list[tune_sweep.PointResult] = []
    async with contextlib.AsyncExitStack() as stack:
        url = None
        for index, point in enumerate(points):
            await stack.aclose()
            if len(points) > 1:
                console.rule(
                    f"sweep point {index + 1}/{len(points)}: {tune_sweep.point_label(point)}"
                )
            url = await stack.enter_async_context(launch(point, index))
            async with LoadSession(
                dataclasses.replace(cfg, url=url),
                spec,
                console=console,
                show_progress=not args.no_progress,
            ) as session:
                result = await measured_search(session)
            rows.append(tune_sweep.PointResult(point, result, session.info))
            console.print("answer: " + tune_probe.binding(result, slo).text)
        winner = tune_sweep.pick_best(rows)
        pct = f"p{slo.percentile:g}"
        if len(rows) > 1:
            console.print(tune_sweep.sweep_table(rows, winner, pct))
            plots.sweep_plot(rows, slo, out / "tune_sweep.png")
        if winner is None:
            console.print(f"[red]no concurrency from 1 meets the SLO ({slo.describe()})")
            plots.search_path(rows[-1].result.probes, slo, out / "tune_search.png")
            return 1
        if winner is not rows[-1]:  # restart the server with the winning settings
            await stack.aclose()
            console.rule(f"soak at the best point: {winner.label}")
            url = await stack.enter_async_context(launch(winner.point, len(points)))
        result = winner.result
        async with LoadSession(
            dataclasses.replace(cfg, url=url),
            spec,
            console=console,
            show_progress=not args.no_progress,
        ) as session:
            if soak_s is None:
                soak_s = 1800.0 if (session.info.device or "cpu").startswith("cuda") else 60.0
            console.print(
                f"best concurrency {result.best} (first bad: {result.first_bad}); "
                f"soaking {soak_s:g}s"
            )
            await warm_up(session, result.best)
            soak_stage = await session.run(Stage("closed", result.best, duration_s=soak_s), "soak")
            soak = summarize(soak_stage, slo)
            drift = tuning.detect_drift(soak_stage.results, session.samples)
            for reason in tuning.check_slo(soak, slo):
                drift.notes.append(f"soak broke the SLO: {reason}")
    info = session.info
    name = args.name or "-".join(
        x.replace("/", "_").replace(" ", "_")
        for x in (info.model or "model", info.gpu_name or info.device or "unknown")
    )
    workload = {
        "input_len": args.input_len,
        "output_len": args.output_len,
        "prefix_len": args.prefix_len,
        "jsonl": str(args.jsonl or ""),
    }
    prof = tuning.build_profile(
        name, info, result, soak, drift, slo, workload, soak_s, chosen=winner.point
    )
    path = tuning.write_tuned_profile(prof, args.profile_out)
    summaries = [p.summary for p in sorted(result.probes, key=lambda p: p.concurrency)]
    console.print(table(summaries + [soak], slo, title="appliance tune (probes, then soak)"))
    console.print(
        ("[green]soak stable" if drift.stable else "[yellow]soak drift: ") + "; ".join(drift.notes)
    )
    paths = [plots.search_path(result.probes, slo, out / "tune_search.png")]
    paths += [out / "tune_sweep.png"] if len(rows) > 1 else []
    paths += plots.bench_plots(summaries, soak_stage.results, session.samples, slo, out)
    _write_json(out / "tune.json", path, rows, winner, drift, slo)
    console.print(f"bound by {prof.capacity['bound_by']}: {prof.capacity['binding']}")
    console.print(f"profile: {path}")
    console.print(f"results written to {out}: tune.json", highlight=False, soft_wrap=True)
    console.print("plots: " + ", ".join(str(p) for p in paths), highlight=False, soft_wrap=True)
    return 0  # drift is recorded in the profile (soak.stable) and printed above


def _fixed_url(url: str):
    @contextlib.asynccontextmanager
    async def launch(point: dict, index: int):
        yield url

    return launch


def _write_json(path: Path, profile: Path, rows, winner, drift, slo) -> None:
    def probes(result):
        return [
            {
                "concurrency": p.concurrency,
                "ok": p.ok,
                "reasons": p.reasons,
                "output_token_throughput": p.summary.output_token_throughput,
                "goodput": p.summary.goodput,
                "attempts": p.attempts,
                "discarded": p.discarded,
                "disturbances": p.disturbances,
            }
            for p in result.probes
        ]

    def bound(result) -> dict:
        b = tune_probe.binding(result, slo)
        return {"bound_by": b.bound_by, "binding": b.text}

    doc = {
        "profile": str(profile),
        "best": winner.result.best,
        "first_bad": winner.result.first_bad,
        **bound(winner.result),
        "point": winner.point,
        "probes": probes(winner.result),
        "sweep": [
            {
                "point": r.point,
                "best": r.result.best,
                "first_bad": r.result.first_bad,
                **bound(r.result),
                "probes": probes(r.result),
            }
            for r in rows
        ],
        "drift_notes": drift.notes,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
