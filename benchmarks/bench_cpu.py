"""CPU throughput benchmark: our engine against transformers on the same prompts, same run.

32 requests, prompts of 32-256 random tokens, 128 output tokens each (greedy, EOS ignored), the
embedded SmolLM2-135M model in fp32. Transformers runs a static batch with left padding
(`generate`) and its continuous batching (`generate_batch`). Prints a table of output tokens/s.

    .venv/bin/python scripts/bench_cpu.py [--num-requests 32] [--output-len 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from engine import LLM, SamplingParams
from engine.models.loader import resolve_model_folder


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for length in lens]


def bench_ours(prompts, output_len: int) -> tuple[float, list[list[int]]]:
    llm = LLM(None, device="cpu", dtype="float32")
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    llm.generate([prompts[0][:8]], SamplingParams(max_tokens=2))  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, [o.token_ids for o in outs]


def bench_hf_static(model, prompts, output_len: int, pad_id: int) -> tuple[float, list[list[int]]]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=output_len,
        min_new_tokens=output_len,
        do_sample=False,
        pad_token_id=pad_id,
    )
    elapsed = time.perf_counter() - start
    return elapsed, out[:, width:].tolist()


def bench_hf_batch(model, prompts, output_len: int) -> float:
    from transformers import GenerationConfig

    cfg = GenerationConfig(
        max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, eos_token_id=None
    )
    start = time.perf_counter()
    model.generate_batch(prompts, generation_config=cfg, max_new_tokens=output_len)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--min-prompt", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=256)
    ap.add_argument("--skip-hf", action="store_true", help="only run our engine")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    folder = resolve_model_folder(None)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    prompts = make_prompts(args.num_requests, args.min_prompt, args.max_prompt, vocab, seed=0)
    total_out = args.num_requests * args.output_len
    rows: dict[str, float] = {}

    elapsed, ours = bench_ours(prompts, args.output_len)
    rows["llm-appliance (continuous batching, paged KV)"] = total_out / elapsed
    agreement = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(folder)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        elapsed, theirs = bench_hf_static(model, prompts, args.output_len, pad)
        rows[f"transformers generate, static batch {args.num_requests}"] = total_out / elapsed
        same = sum(a[:16] == b[:16] for a, b in zip(ours, theirs))
        agreement = f"{same}/{len(prompts)} requests share their first 16 greedy tokens"
        try:
            elapsed = bench_hf_batch(model, prompts, args.output_len)
            rows["transformers generate_batch (continuous batching)"] = total_out / elapsed
        except Exception as exc:  # report, don't hide: the row says why it is missing
            rows[f"transformers generate_batch: failed ({type(exc).__name__}: {exc})"[:120]] = 0.0

    table = Table(
        title=f"CPU, {os.cpu_count()} cores, SmolLM2-135M fp32: {args.num_requests} "
        f"requests, prompts U[{args.min_prompt},{args.max_prompt}], "
        f"{args.output_len} output tokens each"
    )
    table.add_column("engine")
    table.add_column("output tok/s", justify="right")
    table.add_column("vs static batch", justify="right")
    static = next((v for k, v in rows.items() if "static" in k), None)
    for name, tps in rows.items():
        ratio = f"{tps / static:.2f}x" if static and tps else ""
        table.add_row(name, f"{tps:.1f}", ratio)
    Console().print(table)
    if agreement:
        print(f"greedy agreement with transformers: {agreement}")
    if args.json:
        args.json.write_text(
            json.dumps({"output_tok_per_s": rows, "agreement": agreement}, indent=2)
        )


if __name__ == "__main__":
    main()
