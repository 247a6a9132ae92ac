"""Timed greedy generation, shared by the GPU benchmarks (bench_gpu.py, gpu_hf.py, bench_quant.py):
greedy sampling that ignores EOS, so every request makes its full length."""

from __future__ import annotations

import time

from engine import LLM, SamplingParams


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def timed_generate(llm: LLM, prompts, output_lens) -> tuple[float, list, dict]:
    """Warm up on the same batch (short), then time one generate; returns (s, outputs, stats)."""
    llm.generate([p[:32] for p in prompts], greedy(4))
    before = llm.engine.stats()
    start = time.perf_counter()
    outs = llm.generate(prompts, [greedy(n) for n in output_lens])
    elapsed = time.perf_counter() - start
    after = llm.engine.stats()
    stats = {k: after[k] - before[k] for k in ("num_steps", "num_preemptions_total")}
    return elapsed, outs, stats
