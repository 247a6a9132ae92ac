"""Swap time of the model registry against a warm restart: one model served under two names
with room for one (`--models-max 1`), requests alternating between them, so every request
unloads one engine core and loads the other before its first token; then the same model served
alone by fresh servers, one after another in this process (the kernel caches already warm from
the swaps' loads), each timed from its start to its first token.

On a GPU, the goal (an 8B bf16 model swapped in within 1.2x its warm restart) is measured on
Llama-3-8B's shape with random weights (profiles/models/llama-3-8b.json, as `appliance serve
--model llama-3-8b --load-format random` serves it), warmed up on load as `serve` does:

    python -m benchmarks.bench_registry_swap --preset llama-3-8b --load-format random \
        --device cuda --warmup --swaps 6 --restarts 3

Prints the median first-token time after a swap, the warm restart's median, their ratio, the
first token on the loaded model, and the engine's own start-up seconds by phase (the core's
plan report, startup_s), so the registry's share (drain, process end, planning ahead, process
start) is what remains. The default is the embedded model on the CPU:

    python -m benchmarks.bench_registry_swap [--swaps 6] [--restarts 2] [--device cpu]
        [--warmup] [--preset NAME [--tiny]] [--load-format auto|random]

--tiny serves the preset's architecture with benchmarks.presets.TINY_DIMS' layers (a quick CPU
run of the same code path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from appliance import model_presets
from appliance.server import create_app
from appliance.server.app_keys import REGISTRY, STATE
from appliance.server.state import Phase, ServerState
from appliance.settings import ServeSettings
from benchmarks.presets import TINY_DIMS
from engine.models.embedded import default_model_path

BODY = {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
GOAL = 1.2
"""The most a swap's first token may take, as a multiple of the warm restart's."""


@dataclass
class Timings:
    """What the swaps and the restarts measured, in seconds."""

    loaded: list[float] = field(default_factory=list)
    """First token on the model already loaded."""
    swapped: list[float] = field(default_factory=list)
    """First token of a request whose model had to be swapped in."""
    restarts: list[float] = field(default_factory=list)
    """A fresh server's start to its first token."""
    swap_startup: list[dict] = field(default_factory=list)
    """The swapped-in engines' startup_s (phase -> seconds, and "total")."""
    restart_startup: list[dict] = field(default_factory=list)


def model_path(preset: str | None, tiny: bool, parent: Path) -> str:
    """What the server loads: the embedded model's folder (no preset), the preset's name (the
    server resolves it as `serve --model NAME` does), or with `tiny` a folder under `parent` of
    the preset with TINY_DIMS' layers (the tokenizer's vocabulary kept)."""
    if preset is None:
        return str(default_model_path())
    if not tiny:
        return preset
    folder = model_presets.preset_folder(preset, cache_root=parent)
    config = json.loads((folder / "config.json").read_text())
    config.update({k: v for k, v in TINY_DIMS.items() if k != "vocab_size"})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return str(folder)


def serve_settings(models: str | list[str], args: argparse.Namespace, **extra) -> ServeSettings:
    return ServeSettings(
        model=models,
        device=args.device,
        warmup=args.warmup,
        load_format=args.load_format,
        max_model_len=args.max_model_len,
        log_level="warning",
        **extra,
    )


async def first_token_s(client: TestClient, model: str | None = None) -> float:
    start = time.perf_counter()
    body = BODY if model is None else {**BODY, "model": model}
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    await resp.read()
    return time.perf_counter() - start


async def wait_ready(app: web.Application) -> None:
    while app[STATE].phase is not Phase.READY:
        if app[STATE].phase is Phase.FAILED:
            raise RuntimeError(f"the model failed to load: {app[STATE].load_error}")
        await asyncio.sleep(0.01)


def startup_s(state: ServerState) -> dict:
    plan = state.engine.plan or {}
    return dict(plan.get("startup_s") or {})


async def run_swaps(path: str, args: argparse.Namespace, timings: Timings) -> None:
    """Two names for `path`, --models-max 1, `args.swaps` requests alternating between them."""
    app = create_app(serve_settings([f"x={path}", f"y={path}"], args, models_max=1))
    async with TestClient(TestServer(app)) as client:
        await wait_ready(app)
        timings.loaded += [await first_token_s(client, "x") for _ in range(3)]
        for i in range(args.swaps):
            model = "y" if i % 2 == 0 else "x"
            timings.swapped.append(await first_token_s(client, model))
            timings.swap_startup.append(startup_s(app[REGISTRY].entries[model].state))


async def run_restarts(path: str, args: argparse.Namespace, timings: Timings) -> None:
    """`args.restarts` fresh servers of `path` alone, one after the other."""
    for _ in range(args.restarts):
        start = time.perf_counter()
        app = create_app(serve_settings(path, args))
        async with TestClient(TestServer(app)) as client:
            await wait_ready(app)
            await first_token_s(client)
            timings.restarts.append(time.perf_counter() - start)
            timings.restart_startup.append(startup_s(app[STATE]))


def phase_medians(reports: list[dict]) -> dict[str, float]:
    """Each phase's median over the reports (a phase missing from one counts 0 there)."""
    names = list(dict.fromkeys(name for report in reports for name in report))
    return {n: statistics.median(r.get(n, 0.0) for r in reports) for n in names}


def report(timings: Timings, label: str) -> list[str]:
    """The printed lines."""
    swap, restart = statistics.median(timings.swapped), statistics.median(timings.restarts)
    loaded = statistics.median(timings.loaded)
    by_swap, by_restart = map(phase_medians, (timings.swap_startup, timings.restart_startup))
    engine = by_swap.get("total", 0.0)
    lines = [
        label,
        f"swap: first token after a swap, median {swap:.2f} s",
        f"warm restart: a fresh server's start to its first token, median {restart:.2f} s",
        f"ratio swap / warm restart: {swap / restart:.2f} (goal <= {GOAL})",
        f"loaded: first token on the loaded model, median {loaded * 1000:.1f} ms",
        "engine start-up (the core's startup_s), median s: swap / warm restart",
    ]
    lines += [
        f"  {name:<14} {by_swap.get(name, 0.0):8.2f} {by_restart.get(name, 0.0):8.2f}"
        for name in dict.fromkeys([*by_swap, *by_restart])
    ]
    lines.append(
        f"registry share (swap - engine start-up - loaded): {swap - engine - loaded:.2f} s"
    )
    return lines


async def run(args: argparse.Namespace) -> Timings:
    """The swaps, then the restarts (every start after the first finds the caches warm)."""
    if args.device == "cuda":  # where `serve` keeps Triton's kernels
        from appliance.triton_cache import triton_cache_env

        triton_cache_env()
    timings = Timings()
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(args.preset, args.tiny, Path(tmp))
        await run_swaps(path, args, timings)
        await run_restarts(path, args, timings)
    return timings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--restarts", type=int, default=2, help="warm restarts timed")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--warmup", action="store_true", help="warm each engine up on load")
    parser.add_argument("--preset", help="a model-shape preset (default: the embedded model)")
    parser.add_argument("--load-format", default="auto", choices=("auto", "random"))
    parser.add_argument("--tiny", action="store_true", help="the preset with tiny layers")
    parser.add_argument("--max-model-len", type=int, default=512)
    args = parser.parse_args(argv)
    if args.tiny and args.preset is None:
        parser.error("--tiny needs --preset")
    if args.preset is not None and args.load_format != "random":
        parser.error("a preset has no weights: add --load-format random")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    timings = asyncio.run(run(args))
    model = args.preset or "embedded SmolLM2-135M"
    model += " (tiny)" if args.tiny else ""
    model += " (random weights)" if args.load_format == "random" else ""
    label = (
        f"device={args.device} warmup={args.warmup} swaps={args.swaps} "
        f"restarts={args.restarts} model={model}"
    )
    print("\n".join(report(timings, label)))


if __name__ == "__main__":
    main()
