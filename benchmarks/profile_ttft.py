"""Where workload C's time to first token goes: TTFT per prompt length with overlapped steps on
and off, and a torch.profiler kernel table of one request per length.

    python -m benchmarks.profile_ttft [--preset llama-3-8b] [--lengths 1024,4096]
        [--load 256]   # first serve 256 requests at once (as workload A does), then measure

Also prints, per length, how long the host takes to queue the model's forward against how long
the GPU takes to run it: a queueing time near the GPU time means the host sets TTFT.

TTFT = first_token_time - arrival_time, as scripts/bench_gpu.py measures it (max_tokens=1).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.presets import materialise_preset, random_prompts
from benchmarks.profile_workload import kernel_table
from engine import LLM, SamplingParams


def ttft_ms(llm: LLM, n: int, seed: int) -> float:
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    vocab = llm.engine.model_config.vocab_size
    (out,) = llm.generate(random_prompts(1, n, n, vocab, seed=seed), params)
    return (out.metrics.first_token_time - out.metrics.arrival_time) * 1e3


def sm_clock_mhz() -> int | None:
    """The GPU's current SM clock (None where NVML cannot say)."""
    try:
        return torch.cuda.clock_rate()
    except Exception:  # noqa: BLE001 - no pynvml, or NVML refuses: the figure is optional
        return None


def enqueue_vs_gpu(llm: LLM, n: int, repeats: int) -> tuple[list[float], list[float], list]:
    """Host ms to queue the forward, GPU ms to run it, and the SM clock (MHz) read while it
    runs, for `repeats` prompts of n tokens."""
    model = llm.engine.runner.model
    forward, host, gpu, clocks = model.forward, [], [], []

    def timed(*args, **kwargs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        out = forward(*args, **kwargs)
        host.append((time.perf_counter() - t0) * 1e3)
        clocks.append(sm_clock_mhz())
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
        return out

    model.forward = timed
    try:
        for i in range(repeats):
            ttft_ms(llm, n, seed=50 + i)
    finally:
        del model.forward  # back to the class's method
    return host, gpu, clocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-num-seqs", type=int, default=16, help="bench_gpu's engine has 256")
    ap.add_argument("--load", type=int, default=0, help="requests served before measuring")
    args = ap.parse_args()
    lengths = [int(v) for v in args.lengths.split(",")]
    folder = materialise_preset(args.preset, tempfile.mkdtemp())
    llm = LLM(
        folder,
        load_format="random",
        seed=0,
        max_model_len=max(lengths) + 256,
        max_num_seqs=max(args.max_num_seqs, args.load),
        max_num_batched_tokens=max(8192, max(lengths)),
    )
    engine = llm.engine
    if args.load:  # an A-like burst: prompts of 100-1,024 tokens, 128 tokens out each
        vocab = engine.model_config.vocab_size
        burst = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
        llm.generate(random_prompts(args.load, 100, 1024, vocab, seed=5), burst)
        print(f"served {args.load} requests first")
    for n in lengths:
        ttft_ms(llm, n, seed=1)  # warm-up
        for overlap in (True, False):
            engine._overlap = overlap
            runs = [ttft_ms(llm, n, seed=2 + i) for i in range(args.repeats)]
            print(
                f"TTFT {n} tokens, overlap {overlap}: median {statistics.median(runs):.1f} ms "
                f"runs {' '.join(f'{r:.1f}' for r in runs)}"
            )
        engine._overlap = True
        host, gpu, clocks = enqueue_vs_gpu(llm, n, args.repeats)
        print(
            f"forward of {n} tokens: host queues it in {statistics.median(host):.1f} ms, "
            f"GPU runs it in {statistics.median(gpu):.1f} ms (medians of {args.repeats}); "
            f"SM clock while it runs: {clocks} MHz"
        )
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            wall = ttft_ms(llm, n, seed=99) / 1e3
            torch.cuda.synchronize()
        print(f"kernels of one {n}-token request:")
        kernel_table(prof, wall, 1, top=16)


if __name__ == "__main__":
    main()
