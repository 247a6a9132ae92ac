"""GPU benchmark of weight quantization: none / int8 / int4 on the Llama-3-8B shape (random
weights): weight memory, batch-1 decode tok/s (workload B) and a reduced workload A.

    PYTHONPATH=. python scripts/bench_quant.py --out DIR [--quick] [--kinds none,int8,int4]

Batch-1 decode reads every weight once per token, so its floor is (weight bytes + KV bytes) /
the copy bandwidth measured in the same run; the goal is int8 >= 1.6x and
int4 >= 2.5x the bf16 tok/s. Weight memory = torch.cuda.memory_allocated after building the
model alone. Prints a table; writes DIR/bench_quant.json. Needs bitsandbytes for int8/int4.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.bench_gpu import batch1_rates
from benchmarks.floor import measure_hardware
from benchmarks.generate import greedy
from benchmarks.presets import materialise_preset, random_prompts
from engine import LLM
from engine.config import EngineConfig
from engine.models.loader import load_model
from engine.models.model_config import ModelConfig
from engine.quant.checkpoints import resolve_weight_quant

PRESET = "llama-3-8b"
GOALS = {"int8": 1.6, "int4": 2.5}  # batch-1 speed-up over none (16-bit)
SIZES = {
    "full": dict(
        b_prompt=128, b_output=512, b_repeats=3, a_requests=128, a_prompt=(100, 1024), a_output=256
    ),
    "quick": dict(
        b_prompt=128, b_output=128, b_repeats=1, a_requests=32, a_prompt=(100, 512), a_output=64
    ),
}


def weight_memory(folder: Path, kind: str, dtype: torch.dtype) -> int:
    """torch.cuda.memory_allocated of the model alone (random weights), quantized as asked."""
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    cfg = ModelConfig.from_folder(folder)
    quant = resolve_weight_quant(EngineConfig(quantization=kind), cfg)
    model = load_model(folder, cfg, 2048, dtype, torch.device("cuda"), True, quant)
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated() - before
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return used


def bench_kind(folder: Path, kind: str, sz: dict, bandwidth: float, eager: bool) -> dict:
    row: dict = {"quantization": kind}
    row["weight_bytes"] = weight_memory(folder, kind, torch.bfloat16)
    need = max(sz["a_prompt"][1] + sz["a_output"], sz["b_prompt"] + sz["b_output"])
    start = time.perf_counter()
    llm = LLM(
        folder,
        device="cuda",
        dtype="bfloat16",
        quantization=kind,
        load_format="random",
        max_model_len=-(-need // 256) * 256,
        max_num_seqs=sz["a_requests"],
        seed=0,
        enforce_eager=eager,
    )
    torch.cuda.synchronize()
    row["build_s"] = round(time.perf_counter() - start, 1)
    row["allocated_after_build"] = torch.cuda.memory_allocated()
    vocab = llm.engine.model_config.vocab_size
    row["b_tok_s"] = statistics.median(batch1_rates(llm, sz))  # workload B
    kv = llm.engine.model_config.kv_cache_bytes_per_token("bfloat16")
    context = sz["b_prompt"] + sz["b_output"] / 2
    row["b_floor_tok_s"] = bandwidth / (row["weight_bytes"] + context * kv)
    # Reduced workload A: all requests at t=0.
    n, (lo, hi) = sz["a_requests"], sz["a_prompt"]
    prompts = random_prompts(n, lo, hi, vocab, seed=10)
    llm.generate([p[:32] for p in prompts], greedy(4))  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, greedy(sz["a_output"]))
    row["a_out_tok_s"] = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
    row["a_requests"], row["a_output"] = n, sz["a_output"]
    del llm, outs
    gc.collect()
    torch.cuda.empty_cache()
    return row


def print_table(rows: list[dict], bandwidth: float) -> None:
    base = next((r for r in rows if r["quantization"] == "none" and "b_tok_s" in r), None)
    table = Table(
        title=f"weight quantization, {PRESET} shape, bf16 activations "
        f"(copy bandwidth {bandwidth / 1e12:.2f} TB/s)"
    )
    for col in (
        "quant",
        "weights GiB",
        "B tok/s",
        "B floor",
        "% floor",
        "B vs none",
        "goal",
        "A out tok/s",
        "A vs none",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        if "error" in r:
            table.add_row(r["quantization"], "error: " + r["error"][:60])
            continue
        speed = r["b_tok_s"] / base["b_tok_s"] if base else None
        a_speed = r["a_out_tok_s"] / base["a_out_tok_s"] if base else None
        goal = GOALS.get(r["quantization"])
        verdict = (
            ""
            if goal is None or speed is None
            else (f">= {goal}x " + ("met" if speed >= goal else "MISSED"))
        )
        table.add_row(
            r["quantization"],
            f"{r['weight_bytes'] / 2**30:.2f}",
            f"{r['b_tok_s']:.1f}",
            f"{r['b_floor_tok_s']:.1f}",
            f"{100 * r['b_tok_s'] / r['b_floor_tok_s']:.0f}%",
            "" if speed is None else f"{speed:.2f}x",
            verdict,
            f"{r['a_out_tok_s']:.0f}",
            "" if a_speed is None else f"{a_speed:.2f}x",
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for bench_quant.json")
    p.add_argument("--quick", action="store_true", help="short runs (a few minutes)")
    p.add_argument("--kinds", default="none,int8,int4", help="comma-separated quantizations")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    sz = SIZES["quick" if args.quick else "full"]
    hw = measure_hardware(torch.device("cuda"), torch.bfloat16)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        folder = materialise_preset(PRESET, tmp)
        for kind in args.kinds.split(","):
            try:
                rows.append(bench_kind(folder, kind, sz, hw.bandwidth, args.eager))
            except Exception as e:  # one failure must not hide the other rows
                traceback.print_exc()
                rows.append({"quantization": kind, "error": f"{type(e).__name__}: {e}"})
                failed = True
            result = {"preset": PRESET, "sizes": sz, "bandwidth": hw.bandwidth, "rows": rows}
            (args.out / "bench_quant.json").write_text(json.dumps(result, indent=2))
    print_table(rows, hw.bandwidth)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
