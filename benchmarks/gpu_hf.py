"""bench_gpu's comparison with transformers: its continuous batching (`generate_batch`) and our
engine on a reduced workload A, same prompts, random weights (`bench_gpu.py --compare-hf`)."""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.bench_gpu import BIG, Engines
from benchmarks.generate import timed_generate
from benchmarks.presets import load_preset, random_prompts


def compare_hf(engines: Engines, sz: dict, args: argparse.Namespace) -> dict:
    """Reduced workload A on our engine, then on transformers' generate_batch (same prompts)."""
    preset, n, out_len = BIG, sz["hf_requests"], sz["hf_output"]
    raw = load_preset(preset, args.tiny)
    prompts = random_prompts(n, *sz["a_prompt"], raw["vocab_size"], seed=40)
    llm = engines.get(preset)
    elapsed, outs, _ = timed_generate(llm, prompts, [out_len] * n)
    ours = sum(len(o.token_ids) for o in outs) / elapsed
    engines.drop()
    try:
        hf, hf_tokens = _hf_generate_batch(raw, prompts, out_len, args)
    finally:
        engines.drop()  # frees transformers' model too
    return dict(
        model=preset,
        requests=n,
        output_len=out_len,
        prompt_range=list(sz["a_prompt"]),
        ours_tok_s=ours,
        hf_tok_s=hf,
        hf_output_tokens=hf_tokens,
        speedup=ours / hf,
    )


def _hf_generate_batch(raw: dict, prompts, out_len: int, args) -> tuple[float, int]:
    """transformers' continuous batching on random weights: (out tok/s, output tokens)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    cfg = AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "torch_dtype"})
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, args.dtype)).eval()

    def run(batch, tokens):
        gen = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=None)
        return model.generate_batch(batch, generation_config=gen, max_new_tokens=tokens)

    run([p[:32] for p in prompts[:4]], 4)  # warm-up
    start = time.perf_counter()
    results = run(prompts, out_len)
    elapsed = time.perf_counter() - start
    num_out = sum(len(r.generated_tokens) for r in results.values())
    return num_out / elapsed, num_out
