"""Memory per sequence at a long context: Qwen3.5-27B (hybrid: K/V in 16 full layers, a fixed
state in 48 linear layers) against the dense Qwen3-32B (K/V in all 64 layers).

    python -m benchmarks.bench_state_memory [--context 32768] [--dtype bfloat16]
        [--device cuda] [--out FILE]

Per model: the planner's figures (engine.planner.formulas: KV bytes per token x the context in
whole blocks, plus the state bytes per sequence: fp32 recurrent state, conv state in the
activation dtype) and, measured, the engine's own pools for one sequence of that context:
KVPool.allocate with its blocks and StatePool.allocate with one slot (zero-filled tensors, no
weights), read from torch.cuda.memory_allocated around each allocation on CUDA and from the
pools' tensors' bytes elsewhere. Prints a table and, with --out, writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.presets import load_preset
from engine.memory.kv_pool import KVPool
from engine.models.layers import PagedAttention
from engine.models.model_config import ModelConfig
from engine.planner.formulas import (
    ELEMENT_BYTES,
    kv_bytes_per_token,
    size_text,
    state_bytes_per_sequence,
)

MODELS = ("qwen3.5-27b", "qwen3-32b")
"""The hybrid model and its dense comparison (profiles/models/)."""
BLOCK_SIZE = 16


def planned(cfg: ModelConfig, context: int, dtype: str, block_size: int = BLOCK_SIZE) -> dict:
    """The planner's bytes for one sequence of `context` tokens: K/V in whole blocks and the
    linear layers' state (0 for a dense model)."""
    blocks = -(-context // block_size)
    kv = blocks * block_size * kv_bytes_per_token(cfg, dtype)
    state = state_bytes_per_sequence(cfg, ELEMENT_BYTES[dtype])
    return {"blocks": blocks, "kv_bytes": kv, "state_bytes": state, "total_bytes": kv + state}


def _allocated(device: torch.device, make) -> tuple[object, int | None]:
    """(what make() returns, the allocator's growth on CUDA, else None)."""
    if device.type != "cuda":
        return make(), None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    made = make()
    torch.cuda.synchronize(device)
    return made, torch.cuda.memory_allocated(device) - before


def measured(
    cfg: ModelConfig, context: int, dtype: str, device: torch.device, block_size: int = BLOCK_SIZE
) -> dict:
    """The engine's pools for one sequence of `context` tokens, allocated (freed on return):
    each pool's tensor bytes, and on CUDA what the allocator handed out for it."""
    torch_dtype = getattr(torch, dtype)
    blocks = -(-context // block_size)
    attention = [cfg.layer_attention(i) for i in cfg.attention_layer_ids()]
    layers = [PagedAttention(cfg.num_heads, a.num_kv_heads, a.head_dim) for a in attention]
    kv_pool, kv_alloc = _allocated(
        device, lambda: KVPool.allocate(cfg, layers, blocks, block_size, torch_dtype, device)
    )
    row = {"kv_bytes": kv_pool.nbytes, "kv_allocated": kv_alloc, "state_bytes": 0}
    row["state_allocated"] = 0 if device.type == "cuda" else None
    if cfg.linear_layer_ids():
        from engine.memory.state_pool import StatePool

        holders = [SimpleNamespace() for _ in cfg.linear_layer_ids()]  # bound to their views
        state_pool, state_alloc = _allocated(
            device, lambda: StatePool.allocate(cfg, holders, 1, torch_dtype, device)
        )
        row.update(state_bytes=state_pool.nbytes, state_allocated=state_alloc)
    row["total_bytes"] = row["kv_bytes"] + row["state_bytes"]
    return row


def compare(context: int, dtype: str, device: torch.device | None) -> list[dict]:
    """One row per model of MODELS: the planner's figures, and measured ones when `device`."""
    rows = []
    for name in MODELS:
        cfg = ModelConfig.from_dict(load_preset(name))
        row = {"model": name, "context": context, "dtype": dtype}
        row["planned"] = planned(cfg, context, dtype)
        row["measured"] = measured(cfg, context, dtype, device) if device is not None else None
        if device is not None and device.type == "cuda":
            torch.cuda.empty_cache()  # the next model's pools start from a clean allocator
        rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Memory per sequence at {rows[0]['context']:,} tokens ({rows[0]['dtype']})"
    )
    for col in ("model", "K/V", "state", "total", "measured K/V", "measured state", "allocated"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in rows:
        p, m = row["planned"], row["measured"] or {}
        allocated = [m.get("kv_allocated"), m.get("state_allocated")]
        table.add_row(
            row["model"],
            size_text(p["kv_bytes"]),
            size_text(p["state_bytes"]),
            size_text(p["total_bytes"]),
            size_text(m["kv_bytes"]) if m else "n/a",
            size_text(m["state_bytes"]) if m else "n/a",
            size_text(sum(allocated)) if m and None not in allocated else "n/a",
        )
    Console(width=120).print(table)
    hybrid, dense = (r["planned"]["total_bytes"] for r in rows)
    print(
        f"{rows[0]['model']} takes {hybrid / dense:.1%} of {rows[1]['model']}'s memory a sequence"
    )


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=32768, help="tokens per sequence")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "none")
    ap.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = ap.parse_args(argv)
    device = None if args.device == "none" else torch.device(args.device)
    rows = compare(args.context, args.dtype, device)
    print_rows(rows)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
