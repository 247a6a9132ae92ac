"""What the first users of a fresh server wait for: start `appliance serve` with an empty private
Triton cache, note how long it took to become healthy and its start-up breakdown, then send
waves of requests right away and print, per wave, TTFT p50/p95, the Triton cache's file count
and the server's own count of kernels compiled after warm-up. A second start on the now-filled
cache shows what a restart costs.

    PYTHONPATH=. python scripts/bench_first_wave.py --model llama-3-8b --load-format random \\
        --out DIR
    PYTHONPATH=. python scripts/bench_first_wave.py --device cpu --out DIR   # embedded model

Waves (requests at concurrency): 32 at 16, the same again, 16 at 8, 64 at 32, 32 at 16;
prompts U[100,1024] random token ids (U[8,32] on a CPU), 64 output tokens (8), ignore_eos.
Results: DIR/first_wave.json and the bench runs under DIR/start-K/wave-N/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks import ROOT

WAVES = [(32, 16), (32, 16), (16, 8), (64, 32), (32, 16)]
STARTUP_LINE = re.compile(r"startup: (.*)$", re.M)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/first_wave"))
    ap.add_argument("--model", default=None, help="preset name or folder (default: embedded)")
    ap.add_argument("--load-format", choices=("auto", "random"), default="auto")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--starts", type=int, default=2, help="server starts on the same cache")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve flag")
    return ap.parse_args(argv)


def start_server(args, env: dict, log: Path) -> tuple[subprocess.Popen, str, float]:
    """Launch serve; return it, its URL and the seconds until it printed its serving line."""
    cmd = [sys.executable, "-m", "appliance", "serve", "--port", "0", "--device", args.device]
    if args.model:
        cmd += ["--model", args.model]
    if args.load_format != "auto":
        cmd += ["--load-format", args.load_format]
    cmd += args.serve_arg
    start = time.monotonic()
    err = log.open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    for line in proc.stdout:
        match = re.search(r"at (http://\S+)/v1", line)
        if match:
            return proc, match.group(1), time.monotonic() - start
    raise RuntimeError(f"appliance serve did not start:\n{log.read_text()[-3000:]}")


def stats(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/v1/stats", timeout=30) as r:
        return json.load(r)


def wave(url: str, n: int, c: int, lens: tuple[str, str], out: Path, env: dict) -> dict:
    cmd = [sys.executable, "-m", "appliance", "bench", "--url", url, "--mode", "closed"]
    cmd += ["--concurrency", str(c), "--num-requests", str(n), "--input-len", lens[0]]
    cmd += ["--output-len", lens[1], "--out", str(out), "--no-progress", "--processes", "1"]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, timeout=600)
    summary = json.loads((out / "bench.json").read_text())["summaries"][0]
    ttft = summary["latency"]["ttft_s"]
    p50, p95 = ttft["p50"] * 1e3, ttft["p95"] * 1e3
    return {"requests": n, "concurrency": c, "ttft_p50_ms": p50, "ttft_p95_ms": p95}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="triton-first-wave-"))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONPATH": path}
    lens = ("uniform:100-1024", "64") if args.device == "cuda" else ("uniform:8-32", "8")
    doc = {"model": args.model, "device": args.device, "starts": []}
    for k in range(args.starts):
        folder = args.out / f"start-{k + 1}"
        folder.mkdir(exist_ok=True)
        proc, url, healthy_s = start_server(args, env, folder / "serve.log")
        try:
            files = sum(1 for _ in cache.rglob("*") if _.is_file())
            breakdown = STARTUP_LINE.findall((folder / "serve.log").read_text())
            compiles = stats(url)["engine"]["compiles_after_warmup"]
            rows = [{"wave": "after warm-up", "cache_files": files, "compiles": compiles}]
            for i, (n, c) in enumerate(WAVES):
                row = wave(url, n, c, lens, folder / f"wave-{i + 1}", env)
                row["cache_files"] = sum(1 for _ in cache.rglob("*") if _.is_file())
                row["compiles"] = stats(url)["engine"]["compiles_after_warmup"]
                rows.append(row)
        finally:
            proc.terminate()
            proc.wait(120)
        start = {"healthy_s": healthy_s, "startup": breakdown, "waves": rows}
        doc["starts"].append(start)
        print(f"start {k + 1}: healthy after {healthy_s:.1f} s; {'; '.join(breakdown)}")
        for row in rows:
            print("  ", json.dumps(row))
    (args.out / "first_wave.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
