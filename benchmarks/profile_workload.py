"""Where a throughput workload's time goes: per-step wall time by step kind (decode-only or with
prefill), and a torch.profiler kernel breakdown of a decode-only window and a mixed window.

    python -m benchmarks.profile_workload --preset llama-3-8b [--requests 256]
        [--prompt 100,1024] [--output 512] [--out DIR]

GPU busy share = sum of kernel time / wall time in the window: well below 1 means the host
(Python scheduling, input preparation, sync) leaves the GPU idle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.presets import materialise_preset, random_prompts
from engine import LLM, SamplingParams


def kernel_table(prof, wall_s: float, steps: int, top: int = 14) -> dict:
    """Top kernels by device time, per step, and the GPU busy share of the window."""
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if dev_us > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((e.key[:70], dev_us / steps / 1e3, e.count // max(steps, 1)))
    rows.sort(key=lambda r: -r[1])
    busy_ms = sum(r[1] for r in rows)
    wall_ms = wall_s / steps * 1e3
    print(
        f"  wall {wall_ms:.2f} ms/step, GPU kernels {busy_ms:.2f} ms/step "
        f"(busy {busy_ms / wall_ms:.0%})"
    )
    for name, ms, count in rows[:top]:
        print(f"    {ms:8.3f} ms  x{count:<4d} {name}")
    return dict(wall_ms=wall_ms, busy_ms=busy_ms, top=rows[:top])


def profiled_steps(engine, steps: int) -> tuple[object, float, int]:
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    done = 0
    with profile(activities=acts) as prof:
        start = time.perf_counter()
        while done < steps and engine.has_unfinished():
            engine.step()
            done += 1
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    return prof, wall, max(done, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt", default="100,1024")
    ap.add_argument("--output", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--window", type=int, default=20, help="profiled steps per window (0: none)")
    ap.add_argument("--warm-passes", type=int, default=0)
    ap.add_argument("--top", type=int, default=14, help="kernels listed per window")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    lo, hi = map(int, args.prompt.split(","))
    folder = materialise_preset(args.preset, "/tmp")
    llm = LLM(
        str(folder),
        load_format="random",
        max_model_len=-(-(hi + args.output) // 256) * 256,
        max_num_seqs=args.requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    engine = llm.engine
    prompts = random_prompts(args.requests, lo, hi, engine.model_config.vocab_size, seed=10)
    params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
    for n in range(args.warm_passes):  # the same workload before, e.g. to rule out JIT compiles
        start = time.perf_counter()
        llm.generate(prompts, params)
        print(f"warm pass {n}: {time.perf_counter() - start:.2f} s")
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    report: dict = {"preset": args.preset, "requests": args.requests}
    print(f"{args.preset}: {args.requests} requests, prompt U[{lo},{hi}], output {args.output}")
    if args.window:  # 0: every step unprofiled (the prefill phase's wall time as served)
        print("mixed window (prefill + decode):")
        prof, wall, n = profiled_steps(engine, args.window)
        report["mixed"] = kernel_table(prof, wall, n, args.top)
    last = {}
    schedule = engine.scheduler.schedule

    def recording_schedule():
        batch = last["batch"] = schedule()
        return batch

    engine.scheduler.schedule = recording_schedule
    steps: list[tuple[int, int, float]] = []  # (decodes, prefill tokens, ms)
    start_all = time.perf_counter()
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        ms = (time.perf_counter() - t) * 1e3
        b = last["batch"]
        steps.append((b.num_decodes, sum(b.num_new_tokens) - b.num_decodes, ms))
        if len(steps) == 200 and args.window:
            print("decode-only window:")
            prof, wall, n = profiled_steps(engine, args.window)
            report["decode"] = kernel_table(prof, wall, n, args.top)
    total = time.perf_counter() - start_all
    ms = [s[2] for s in steps]
    report["steps"] = dict(n=len(ms), total_s=total, median_ms=statistics.median(ms))
    print(
        f"rest of the run: {len(ms)} steps, {total:.2f} s, median {statistics.median(ms):.2f} ms"
        f", p90 {sorted(ms)[int(0.9 * len(ms))]:.2f} ms, max {max(ms):.1f} ms"
    )
    for kind, sel in (
        ("with prefill", [s for s in steps if s[1] > 0]),
        ("decode only", [s for s in steps if s[1] == 0]),
    ):
        if sel:
            sec = sum(s[2] for s in sel) / 1e3
            print(
                f"  {kind}: {len(sel)} steps, {sec:.2f} s, mean {sec / len(sel) * 1e3:.2f} ms, "
                f"mean decodes {statistics.mean(s[0] for s in sel):.0f}, "
                f"prefill tokens {sum(s[1] for s in sel)}"
            )
            report[kind] = dict(steps=len(sel), s=sec)
    print(f"engine: {engine.stats()}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"profile_{args.preset}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
