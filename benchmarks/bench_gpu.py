"""GPU benchmark: workloads A-D (docs/performance.md), each against the floor measured in the
same run.

    PYTHONPATH=. python scripts/bench_gpu.py --out DIR [--quick] [--compare-hf]
        [--workloads A,B,C,D] [--eager] [--planned] [--time-budget 540]

Measures copy bandwidth and bf16 matmul rate, builds random-weight engines in real shapes
(profiles/models/), runs A (256 requests, Llama-3-8B, out tok/s), B (batch-1 decode tok/s), C
(time to first token, 1,024 / 4,096 tokens), D (256 requests, Qwen3-0.6B, out tok/s), a family's
shape where --workloads names it (G3: Gemma 3 12B; G4: Gemma 4 31B; Q3MOE: Qwen3-30B-A3B and
G4MOE: Gemma 4 26B-A4B, whose floors count the experts a step can route to, the active weights
at batch 1; Q35: Qwen3.5-27B, whose floors count the full layers' K/V and each sequence's
linear-attention state read and written back; Q35MOE: Qwen3.5-35B-A3B, both: batch-1 decode
and A's requests each), and prints achieved / floor / target per workload (floor model:
benchmarks/floor.py). Results go to DIR/bench_gpu.json, rewritten after every workload. Each
workload runs under a share of --time-budget (SIGALRM); a failure or timeout becomes a row with
its error. `--compare-hf` also runs transformers' generate_batch and our engine on a reduced
workload A. `--device cpu --tiny` runs tiny shapes on the CPU (the tests' end-to-end check).
`--planned` builds each engine as a plain `LLM(folder)`: the planner chooses every setting
(max_num_seqs, the step's token budget, max_model_len, the KV pool). Exit status 1 if a
workload raised.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.floor import (
    Hardware,
    ModelShape,
    batch1_decode_floor_tok_s,
    measure_hardware,
    print_tables,
    throughput_floor,
    ttft_floor_s,
    verdict,
)
from benchmarks.generate import greedy, timed_generate
from benchmarks.presets import (
    SIZES,
    materialise_preset,
    random_lengths,
    random_prompts,
)
from engine import LLM

BIG, SMALL = "llama-3-8b", "qwen3-0.6b"  # A, B, C run on BIG; D on SMALL
FAMILIES = {
    "G3": "gemma-3-12b",
    "G4": "gemma-4-31b",
    "Q3MOE": "qwen3-30b-a3b",
    "G4MOE": "gemma-4-26b-a4b",
    "GPTOSS": "gpt-oss-20b",
    "Q35": "qwen3.5-27b",
    "Q35MOE": "qwen3.5-35b-a3b",
}
"""Workload code -> a family's preset: rows CODE-B (batch-1 decode, B's sizes) and CODE-A
(workload A's requests), each against its floor; run when --workloads names the code."""


# --- workloads ---------------------------------------------------------------------------------
@contextmanager
def time_limit(seconds: float):
    """Raise TimeoutError in the main thread after `seconds` (no-op off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"ran past its {seconds:.0f} s limit")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --- engines -------------------------------------------------------------------------------------
class Engines:
    """At most one engine alive at a time (each plans its KV pool from the free memory)."""

    def __init__(self, tmp: Path, args: argparse.Namespace, sz: dict, info: dict) -> None:
        self.tmp, self.args, self.sz, self.info = tmp, args, sz, info
        self.preset: str | None = None
        self.llm: LLM | None = None

    def settings(self, preset: str) -> dict:
        """One engine per model serves every workload on it (A, B, C, HF: no rebuild). With
        --planned, only the device and random weights: the planner chooses everything else,
        as for a plain `LLM(folder)`."""
        sz, a = self.sz, self.args
        if a.planned:
            return dict(device=a.device, load_format="random", seed=0, enforce_eager=a.eager)
        if preset == SMALL:
            need, seqs = sz["d_prompt"][1] + sz["d_output"][1], sz["d_requests"]
        else:  # BIG and the FAMILIES: A, B and C's lengths
            lens = (sz["a_prompt"][1] + sz["a_output"], sz["b_prompt"] + sz["b_output"])
            need = max(*lens, max(sz["c_prompts"]) + 1)
            seqs = max(sz["a_requests"], sz["hf_requests"])
        batched = max(a.max_num_batched_tokens, max(sz["c_prompts"]))  # C: one prefill step
        return dict(
            max_model_len=-(-need // 256) * 256,
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
            device=a.device,
            dtype=a.dtype,
            load_format="random",
            seed=0,
            enforce_eager=a.eager,
            gpu_memory_utilization=a.gpu_memory_utilization,
        )

    def get(self, preset: str) -> LLM:
        if preset != self.preset:
            self.drop()
            start = time.perf_counter()
            folder = materialise_preset(preset, self.tmp, tiny=self.args.tiny)
            self.llm, self.preset = LLM(folder, **self.settings(preset)), preset
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # random weights are drawn asynchronously
            eng = self.llm.engine
            self.info[preset] = {
                "build_s": round(time.perf_counter() - start, 2),
                "num_params": eng.model_config.num_params,
                "config": asdict(eng.config),
                "plan_reasons": eng.plan.reasons,
            }
        return self.llm

    def shape(self) -> ModelShape:
        eng = self.llm.engine
        return ModelShape.from_model_config(
            eng.model_config, eng.dtype.itemsize, eng.kv_dtype.itemsize
        )

    def drop(self) -> None:
        """Release the engine (after a failure too: its state is no longer trusted)."""
        self.llm, self.preset = None, None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _row(name: str, metric: str, achieved, floor, full: bool, detail: dict) -> dict:
    """One table row; `metric` ending in "ms" means lower is better."""
    target, result = verdict(name, achieved, floor) if full else ("", "n/a (reduced)")
    result = "error" if "error" in detail else result
    keys = ("workload", "metric", "achieved", "floor", "target", "verdict", "detail")
    return dict(zip(keys, (name, metric, achieved, floor, target, result, detail), strict=True))


def bench_throughput(
    engines: Engines, hw: Hardware, sz: dict, name: str, full: bool, preset: str = BIG
) -> list:
    """Workload A (on `preset`) or D: many requests at t=0; output tokens / wall time."""
    if name == "D":
        preset, n, (lo, hi) = SMALL, sz["d_requests"], sz["d_prompt"]
        out_lens = random_lengths(n, *sz["d_output"], seed=11)
    else:
        n, (lo, hi) = sz["a_requests"], sz["a_prompt"]
        out_lens = [sz["a_output"]] * n
    llm = engines.get(preset)
    prompts = random_prompts(n, lo, hi, llm.engine.model_config.vocab_size, seed=10)
    elapsed, outs, stats = timed_generate(llm, prompts, out_lens)
    num_out = sum(len(o.token_ids) for o in outs)
    floor = throughput_floor(engines.shape(), hw, [len(p) for p in prompts], out_lens)
    ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    detail = dict(model=preset, requests=n, output_tokens=num_out, elapsed_s=elapsed, **stats)
    detail.update(floor_s=floor.total_s, floor_prefill_s=floor.prefill_s)
    detail.update(median_ttft_s=statistics.median(ttfts))
    return [_row(name, "out tok/s", num_out / elapsed, floor.tok_s, full, detail)]


def batch1_rates(llm: LLM, sz: dict) -> list[float]:
    """Decode tok/s of one request = (tokens - 1) / (finish - first token), per repeat."""
    vocab = llm.engine.model_config.vocab_size
    llm.generate(random_prompts(1, sz["b_prompt"], sz["b_prompt"], vocab, 20), greedy(16))
    rates = []
    for i in range(sz["b_repeats"]):
        prompt = random_prompts(1, sz["b_prompt"], sz["b_prompt"], vocab, seed=21 + i)
        (out,) = llm.generate(prompt, greedy(sz["b_output"]))
        m = out.metrics
        rates.append((len(out.token_ids) - 1) / (m.finished_time - m.first_token_time))
    return rates


def bench_batch1(
    engines: Engines, hw: Hardware, sz: dict, full: bool, preset: str = BIG, name: str = "B"
) -> list:
    """Workload B (on `preset`): batch-1 decode tok/s, median of repeats."""
    rates = batch1_rates(engines.get(preset), sz)
    floor = batch1_decode_floor_tok_s(engines.shape(), hw, sz["b_prompt"], sz["b_output"])
    detail = dict(model=preset, runs=rates, prompt_len=sz["b_prompt"], output_len=sz["b_output"])
    detail["floor_weight_bytes"] = engines.shape().decode_weight_bytes(1)
    return [_row(name, "decode tok/s", statistics.median(rates), floor, full, detail)]


def bench_family(engines: Engines, hw: Hardware, sz: dict, code: str, full: bool) -> list:
    """A family's shape (FAMILIES[code]): batch-1 decode, then workload A's requests. A's
    timeout (its share of the budget spent) becomes A's error row and keeps B's row."""
    preset = FAMILIES[code]
    rows = bench_batch1(engines, hw, sz, full, preset, f"{code}-B")
    try:
        return rows + bench_throughput(engines, hw, sz, f"{code}-A", full, preset)
    except TimeoutError as exc:
        engines.drop()
        return rows + [_row(f"{code}-A", "", None, None, False, {"error": f"TimeoutError: {exc}"})]


def bench_ttft(engines: Engines, hw: Hardware, sz: dict, full: bool) -> list:
    """Workload C: time to first token of one prompt (max_tokens=1), median of repeats."""
    preset = BIG
    llm = engines.get(preset)
    vocab, rows = llm.engine.model_config.vocab_size, []
    for n in sz["c_prompts"]:
        llm.generate(random_prompts(1, n, n, vocab, seed=30), greedy(1))  # warm-up
        times, before = [], _allocator_counts(llm)
        for i in range(sz["c_repeats"]):  # a fresh prompt each time: no prefix reuse
            (out,) = llm.generate(random_prompts(1, n, n, vocab, seed=31 + i), greedy(1))
            times.append((out.metrics.first_token_time - out.metrics.arrival_time) * 1e3)
        floor_ms = ttft_floor_s(engines.shape(), hw, n) * 1e3
        after = _allocator_counts(llm)  # device mallocs/frees during the timed runs (want 0)
        allocator = {k: after[k] - before[k] for k in after}
        detail = dict(model=preset, runs_ms=times, allocator=allocator)
        # host or device: kernel time of one more request (none listed on a CPU)
        detail["profile"] = _profiled_ttft(llm, random_prompts(1, n, n, vocab, seed=40))
        rows.append(_row(f"C-{n}", "TTFT ms", statistics.median(times), floor_ms, full, detail))
    return rows


def _allocator_counts(llm: LLM) -> dict:
    """The caching allocator's device malloc / free / retry counters (empty off CUDA)."""
    if llm.engine.device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(llm.engine.device)
    keys = ("num_device_alloc", "num_device_free", "num_alloc_retries")
    return {k: stats.get(k, 0) for k in keys}


def _profiled_ttft(llm: LLM, prompt: list[list[int]]) -> dict:
    """One more request under torch.profiler: wall vs summed kernel time (busy share well
    below 1 = the host, not the GPU, sets TTFT) and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.profile_workload import kernel_table

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.generate(prompt, greedy(1))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    return kernel_table(prof, wall, 1, top=8)


def write_results(out: Path, results: dict) -> None:
    tmp = out / "bench_gpu.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, default=str))
    tmp.replace(out / "bench_gpu.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out"), help="results folder")
    ap.add_argument("--quick", action="store_true", help="smaller workloads (smoke run)")
    ap.add_argument("--compare-hf", action="store_true", help="transformers on reduced A too")
    known = ",".join(["A", "B", "C", "D", *FAMILIES])
    ap.add_argument("--workloads", default="A,B,C,D", help=f"comma-separated subset of {known}")
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no CUDA graphs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="bfloat16 on a GPU, float32 with --tiny")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU end-to-end check)")
    ap.add_argument(
        "--planned", action="store_true", help="engines as plain LLM(folder): every setting planned"
    )
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--time-budget", type=float, default=540.0, help="seconds for it all")
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("float32" if args.tiny else "bfloat16")
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    if bad := sorted(set(args.workloads) - {*"ABCD", *FAMILIES}):
        ap.error(f"unknown workload(s) {bad}; choose from {known}")
    return args


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gpu_hf import compare_hf

    args = parse_args(argv)
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    sz = SIZES[mode]
    args.out.mkdir(parents=True, exist_ok=True)
    device, deadline = torch.device(args.device), time.monotonic() + args.time_budget
    results: dict = {
        "mode": mode,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:] if argv is None else argv,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "engines": {},
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        hw = measure_hardware(device, getattr(torch, args.dtype))
        results["hardware"] = {**asdict(hw), "dtype": args.dtype}  # bytes/s, FLOP/s
        print(f"copy {hw.bandwidth:.4g} B/s, matmul {hw.matmul_flops:.4g} FLOP/s", flush=True)
        engines = Engines(Path(tmp), args, sz, results["engines"])
        full, c_full = mode == "full", mode != "tiny"
        jobs = {
            "A": lambda: bench_throughput(engines, hw, sz, "A", full),
            "B": lambda: bench_batch1(engines, hw, sz, full),
            "C": lambda: bench_ttft(engines, hw, sz, c_full),
            "HF": lambda: compare_hf(engines, sz, args),  # benchmarks/gpu_hf.py
            "D": lambda: bench_throughput(engines, hw, sz, "D", full),
        }
        for code in FAMILIES:
            jobs[code] = lambda code=code: bench_family(engines, hw, sz, code, full)
        # HF after C and before D: it reuses the big model's engine, then frees the GPU.
        order = [w for w in ("A", "B", "C") if w in args.workloads]
        order += ["HF"] * args.compare_hf + ["D"] * ("D" in args.workloads)
        order += [code for code in FAMILIES if code in args.workloads]
        for i, name in enumerate(order):
            share = _WEIGHTS[name] / sum(_WEIGHTS[w] for w in order[i:])
            value, error = _guarded(name, jobs[name], deadline, share, engines)
            if name == "HF":
                results["compare_hf"] = value if error is None else {"error": error}
            else:
                results["rows"] += value or [_row(name, "", None, None, False, {"error": error})]
            write_results(args.out, results)
        engines.drop()
    print_tables(results)
    print(f"results: {args.out / 'bench_gpu.json'}")
    failed = any("error" in r["detail"] for r in results["rows"])
    return 1 if failed or "error" in results.get("compare_hf", {}) else 0


_WEIGHTS = {"A": 3, "B": 1, "C": 1, "HF": 2, "D": 3, **dict.fromkeys(FAMILIES, 4)}  # time shares


def _guarded(name: str, job, deadline: float, share: float, engines: Engines) -> tuple:
    """Run one workload within its share of the time left: (value, None) or (None, error)."""
    limit = (deadline - time.monotonic()) * share
    if limit < 5:
        return None, "skipped: time budget spent"
    print(f"workload {name} (limit {limit:.0f} s) ...", flush=True)
    try:
        with time_limit(limit):
            return job(), None
    except Exception as exc:  # noqa: BLE001 - reported as a row, the run goes on
        traceback.print_exc()
        engines.drop()
        return None, f"{type(exc).__name__}: {exc}"[:300]


if __name__ == "__main__":
    sys.exit(main())
