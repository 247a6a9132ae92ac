"""The serving path against the offline engine, on the same prompts in one run: the engine
in-process (every setting planned, as a plain `LLM(folder)`), then a real `appliance serve`
subprocess of the same model and plan driven by `appliance bench` from several client
processes. The floor of each served figure is the offline one measured here.

    PYTHONPATH=. python scripts/bench_serve.py --model llama-3-8b --load-format random --out DIR
    PYTHONPATH=. python scripts/bench_serve.py --device cpu --out DIR      # embedded model

Per concurrency level (closed loop; `--rounds` requests per stream, prompts U[lo, hi] random
token ids, `--output-len` tokens with ignore_eos), it prints offline out tok/s, served out tok/s
as the clients received it and as the server's own generated-token counter says, their ratio to
offline, served TPOT p50 against the offline decode step (median wall time of the offline run's
decode-only steps) and TTFT p50 both ways. Each level starts with an unmeasured wave of short
requests on both sides (--no-warmup: none). Results go to DIR/bench_serve.json, the bench runs
to DIR/served-C/. Defaults: the issue's workload on a GPU (levels 1,64,256, prompts 100-1024,
512 output tokens); tiny sizes on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from appliance import model_presets
from appliance.serve_process import launch_serve, stop_server
from benchmarks import ROOT
from benchmarks.presets import random_prompts
from benchmarks.serve_offline import closed_loop, summary
from engine import LLM

WARMUP_TOKENS = 4
PLAN_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_kv_blocks", "dtype")
"""Planned settings compared between the offline engine and the server."""
DEFAULTS = {
    "gpu": dict(concurrency="1,64,256", input_len="100-1024", output_len=512),
    "cpu": dict(concurrency="1,4", input_len="8-32", output_len=8),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/bench_serve"), help="results folder")
    ap.add_argument("--model", default=None, help="preset name, folder or .gguf (None: embedded)")
    ap.add_argument("--load-format", choices=("auto", "random"), default="auto")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if any")
    ap.add_argument("--dtype", default=None, help="default: the engine's choice")
    ap.add_argument("--concurrency", default=None, help="levels, e.g. 1,64,256")
    ap.add_argument("--input-len", default=None, help="prompt tokens LO-HI")
    ap.add_argument("--output-len", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream at each level")
    ap.add_argument("--processes", type=int, default=4, help="client processes (<= streams)")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for key, value in DEFAULTS["gpu" if args.device == "cuda" else "cpu"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
        lo, hi = (int(x) for x in args.input_len.split("-"))
    except ValueError:
        ap.error("--concurrency takes integers like 1,64,256 and --input-len LO-HI")
    args.prompt_range = (lo, hi)
    if not args.levels or min(args.levels) < 1 or args.rounds < 1 or args.processes < 1:
        ap.error("levels, --rounds and --processes must be >= 1")
    if not 1 <= lo <= hi or args.output_len < 1:
        ap.error("need 1 <= LO <= HI and --output-len >= 1")
    return args


def model_path(args) -> str | None:
    """What both sides load: a preset becomes its prepared folder (random weights)."""
    return model_presets.resolve_served_model(args.model, args.load_format)


def engine_settings(args) -> dict:
    settings = dict(device=args.device, load_format=args.load_format, seed=0)
    return settings | ({"dtype": args.dtype} if args.dtype else {})


def level_prompts(args, vocab: int) -> dict[int, list[list[int]]]:
    lo, hi = args.prompt_range
    return {
        c: random_prompts(c * args.rounds, lo, hi, vocab, seed=args.seed + 1000 * i)
        for i, c in enumerate(args.levels)
    }


# --- offline -----------------------------------------------------------------------------------
def run_offline(args, model: str | None) -> tuple[dict, dict, dict]:
    """Build the engine (planned), run every level; returns (per-level summaries, the plan's
    settings, the prompts). The engine is released before the server starts."""
    llm = LLM(model, **engine_settings(args))
    engine = llm.engine
    config = dataclasses.asdict(engine.config)
    prompts = level_prompts(args, engine.model_config.vocab_size)
    rows = {}
    for c in args.levels:
        if not args.no_warmup:
            warm = [p[:64] for p in prompts[c][:c]]
            closed_loop(engine, warm, WARMUP_TOKENS, c, f"warm{c}")
        run = closed_loop(engine, prompts[c], args.output_len, c, f"level{c}")
        rows[c] = summary(run)
        print(f"offline {c:>4}: {rows[c]['out_tok_s']:.1f} out tok/s", flush=True)
    del llm, engine  # this process keeps its CUDA context: the server plans from what is left
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows, config, prompts


# --- served ------------------------------------------------------------------------------------
def subprocess_env() -> dict:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def start_server(args, model: str | None) -> tuple[subprocess.Popen, str]:
    """`appliance serve --port 0` on the same model and settings; returns it and its URL."""
    flags = ["--device", args.device, "--load-format", args.load_format, "--seed", "0"]
    flags += ["--log-level", "warning", "--max-queue", str(max(128, max(args.levels)))]
    flags += (["--model", model] if model else []) + (["--dtype", args.dtype] if args.dtype else [])
    return launch_serve(flags, timeout_s=600, env=subprocess_env())


def bench(url: str, out: Path, level: int, processes: int, *workload: str) -> dict:
    """One `appliance bench` closed-loop run; returns its bench.json."""
    cmd = [sys.executable, "-m", "appliance", "bench", "--url", url, "--no-progress"]
    cmd += ["--concurrency", str(level), "--processes", str(min(processes, level))]
    cmd += ["--duration", "3600s", "--out", str(out), *workload]
    done = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"appliance bench failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads((out / "bench.json").read_text())


def run_served(args, model: str | None, prompts: dict) -> tuple[dict, dict | None]:
    """Serve, then bench each level on its prompts; returns (per-level summaries, the server's
    settings from /v1/stats)."""
    proc, url = start_server(args, model)
    rows, config = {}, None
    try:
        for c in args.levels:
            folder = args.out / f"served-{c}"
            folder.mkdir(parents=True, exist_ok=True)
            if not args.no_warmup:
                lo, hi = args.prompt_range
                warm = ["--num-requests", str(c), "--output-len", str(WARMUP_TOKENS)]
                warm += ["--input-len", f"uniform:{min(lo, 64)}-{min(hi, 64)}"]
                bench(url, folder / "warmup", c, args.processes, *warm)
            jsonl = folder / "prompts.jsonl"
            lines = (json.dumps({"prompt": p, "max_tokens": args.output_len}) for p in prompts[c])
            jsonl.write_text("\n".join(lines) + "\n")
            measured = ["--jsonl", str(jsonl), "--num-requests", str(len(prompts[c]))]
            doc = bench(url, folder, c, args.processes, *measured)
            config = config or (doc["config"]["server"] or {}).get("config")
            rows[c] = served_summary(doc)
            print(f"served  {c:>4}: {rows[c]['out_tok_s']:.1f} out tok/s", flush=True)
    finally:
        stop_server(proc)
    return rows, config


def served_summary(doc: dict) -> dict:
    (s,) = doc["summaries"]
    lat = s["latency"]
    counted = s["server_output_tokens"]
    return {
        "num_requests": s["num_requests"],
        "num_ok": s["num_ok"],
        "errors": s["errors"],
        "num_output_tokens": s["num_output_tokens"],
        "server_output_tokens": counted,
        "wall_s": s["wall_s"],
        "out_tok_s": s["output_token_throughput"],
        "server_tok_s": None if counted is None else counted / s["wall_s"],
        "ttft_p50_s": lat["ttft_s"]["p50"],
        "tpot_p50_s": lat["tpot_s"]["p50"],
        "client_processes": doc["config"]["client_processes"],
    }


# --- report --------------------------------------------------------------------------------------
def rows(args, offline: dict, served: dict) -> list[dict]:
    """One row per level: both sides' figures and the ratios the table shows."""

    def ratio(a, b):
        return a / b if a is not None and b else None

    out = []
    for c in args.levels:
        off, srv = offline[c], served[c]
        out.append(
            {
                "concurrency": c,
                "offline": off,
                "served": srv,
                "served_vs_offline": ratio(srv["out_tok_s"], off["out_tok_s"]),
                "tpot_vs_decode_step": ratio(srv["tpot_p50_s"], off["decode_step_p50_s"]),
            }
        )
    return out


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:.2f}"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def table(results: dict) -> Table:
    t = Table(title=f"served vs offline: {results['model']} on {results['device']}")
    columns = (
        "streams",
        "offline tok/s",
        "served tok/s",
        "server count tok/s",
        "tokens clients/server",
        "served/offline",
        "TPOT p50 ms",
        "offline step ms",
        "TPOT/step",
        "TTFT p50 ms served/offline",
    )
    for name in columns:
        t.add_column(name, justify="right")
    for row in results["rows"]:
        off, srv = row["offline"], row["served"]
        counted = srv["server_tok_s"]
        t.add_row(
            str(row["concurrency"]),
            f"{off['out_tok_s']:.1f}",
            f"{srv['out_tok_s']:.1f}",
            "n/a" if counted is None else f"{counted:.1f}",
            f"{srv['num_output_tokens']} / {srv['server_output_tokens']}",
            _x(row["served_vs_offline"]),
            _ms(srv["tpot_p50_s"]),
            _ms(off["decode_step_p50_s"]),
            _x(row["tpot_vs_decode_step"]),
            f"{_ms(srv['ttft_p50_s'])} / {_ms(off['ttft_p50_s'])}",
        )
    return t


def plan_differences(offline: dict, served: dict | None) -> dict:
    """Planned settings where the server's differ from the offline engine's."""
    if not served:
        return {"server": "did not report its settings"}
    return {
        k: {"offline": offline.get(k), "served": served.get(k)}
        for k in PLAN_KEYS
        if offline.get(k) != served.get(k)
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = model_path(args)
    offline, offline_config, prompts = run_offline(args, model)
    served, served_config = run_served(args, model, prompts)
    results = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:] if argv is None else argv,
        "model": args.model or "embedded",
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "workload": {
            "prompt_tokens": args.prompt_range,
            "output_tokens": args.output_len,
            "requests_per_stream": args.rounds,
            "client_processes": args.processes,
        },
        "offline_config": offline_config,
        "served_config": served_config,
        "plan_differences": plan_differences(offline_config, served_config),
        "rows": rows(args, offline, served),
    }
    (args.out / "bench_serve.json").write_text(json.dumps(results, indent=1, default=str))
    console = Console(width=180)
    if results["plan_differences"]:
        console.print(f"planned settings differ: {results['plan_differences']}")
    console.print(table(results))
    console.print(f"results: {args.out / 'bench_serve.json'}")
    failed = any(r["served"]["num_ok"] < r["served"]["num_requests"] for r in results["rows"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
