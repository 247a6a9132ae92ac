"""How well the planner predicts memory on desktop-sized cards: `appliance profile --measure`
under APPLIANCE_MEMORY_CAP_GIB caps, one weight format each, printing the predicted and the
measured peak after warm-up, each item's error, and the KV blocks planned against those kept.

    python -m benchmarks.bench_plan [--model llama-3-8b] [--caps 16,24]
        [--formats none,int8,int4] [--cases 16:int8,24:none] [--out DIR]

Each case runs in its own process (a cap is per process). A format that cannot fit a cap (bf16
Llama-3-8B on 16 GiB) prints the planner's refusal. Needs a CUDA GPU (and bitsandbytes for
int8/int4). Results: DIR/bench_plan.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import ROOT

GIB = 1024**3
ITEMS = ("weights", "activation", "graph_pool", "kv_pool", "context", "allocator")


def run_case(model: str, cap: float, fmt: str, timeout: float) -> dict:
    env = {**os.environ, "APPLIANCE_MEMORY_CAP_GIB": str(cap), "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "appliance",
        "profile",
        "--model",
        model,
        "--measure",
        "--json",
        "--quantization",
        fmt,
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    case = {"cap_gib": cap, "quantization": fmt, "seconds": round(time.monotonic() - start, 1)}
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {**case, "error": (proc.stderr or proc.stdout)[-2000:]}
    if "error" in report:
        return {**case, "error": report["error"]}
    return {**case, **report}


def row(case: dict) -> str:
    head = f"{case['cap_gib']:>5g} GiB {case['quantization']:>5}"
    if "error" in case:
        return f"{head}  refused/failed: {case['error'].strip().splitlines()[-1][:110]}"
    check = case.get("memory_check")
    plan = case["plan"]
    if not check:
        return f"{head}  no measurement: {case.get('notes')}"
    pred, meas = check["predicted"], check["measured"]
    total = sum(pred.get(i, 0) for i in ITEMS)
    diff = 100 * (check["measured_peak"] - total) / total
    items = " ".join(
        f"{i}={pred[i] / GIB:.2f}/{meas[i] / GIB:.2f}" for i in ITEMS if i in pred and i in meas
    )
    return (
        f"{head}  kv={plan['kv_cache_dtype']:>8} seqs={plan['max_num_seqs']:>3} "
        f"peak {total / GIB:6.2f} -> {check['measured_peak'] / GIB:6.2f} GiB ({diff:+5.1f}%) "
        f"blocks {check['num_kv_blocks']} -> {check['final_blocks']}  [{items}]"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--caps", default="16,24")
    ap.add_argument("--formats", default="none,int8,int4")
    ap.add_argument("--cases", default=None, help="CAP:FORMAT pairs instead of caps x formats")
    ap.add_argument("--out", default=None)
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args()
    if args.cases:
        pairs = [(float(c), f) for c, f in (p.split(":") for p in args.cases.split(","))]
    else:
        pairs = [(float(c), f) for c in args.caps.split(",") for f in args.formats.split(",")]
    cases = []
    for cap, fmt in pairs:
        case = run_case(args.model, cap, fmt, args.timeout)
        cases.append(case)
        print(row(case), flush=True)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "bench_plan.json").write_text(json.dumps(cases, indent=1))
    print(
        "\ncap / weights / KV dtype / sequences / predicted -> measured peak / blocks planned "
        "-> kept / per item predicted/measured GiB"
    )
    for case in cases:
        print(row(case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
