"""Decode attention at workload A's shape: each launch config and split count of
engine/kernels/decode_attention.py, timed in a CUDA graph, against the copy bandwidth measured
in the same run.

    python -m benchmarks.kernels.bench_decode_attention [--seqs 256] [--lens 100,1536]
        [--splits 1,2,4] [--out FILE.json]

The cache is laid out as a served engine leaves it: pages in random order, sequence lengths
U[lo, hi] (A mid-decode: prompts U[100, 1024] plus up to 512 generated). Bytes = the K and V
rows read (the floor); the first config listed is the one the engine launches today.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.floor import measure_hardware
from engine.kernels import decode_attention as da
from engine.kernels import paged_args
from engine.timing import graph_seconds

CONFIGS = [  # (BLOCK_N, num_warps, num_stages)
    (64, 4, 3),
    (64, 4, 2),
    (64, 4, 4),
    (64, 8, 3),
    (32, 4, 3),
    (32, 4, 4),
    (128, 4, 2),
    (128, 8, 2),
    (128, 8, 3),
]


def make_case(args, g: torch.Generator):
    """(q, k_cache, v_cache, block_tables, seq_lens, bytes read) on the GPU, pages shuffled."""
    lo, hi = map(int, args.lens.split(","))
    lens = torch.randint(lo, hi + 1, (args.seqs,), generator=g)
    pages = (lens + args.block_size - 1) // args.block_size
    width = int(pages.max())
    order = torch.randperm(int(pages.sum()), generator=g)
    tables = torch.zeros(args.seqs, width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(pages.tolist()):
        tables[i, :n] = order[used : used + n]
        used += n
    shape = (used, args.block_size, args.kv_heads, args.head_dim)
    k = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(args.seqs, args.heads, args.head_dim, dtype=torch.bfloat16, device="cuda")
    nbytes = int(lens.sum()) * args.kv_heads * args.head_dim * 2 * 2
    return q, k, v, tables.cuda(), lens.int().cuda(), nbytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--lens", default="100,1536", help="sequence lengths U[lo,hi]")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--splits", default="1,2,4")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    hw = measure_hardware(torch.device("cuda"), torch.bfloat16)
    q, k, v, tables, lens, nbytes = make_case(args, torch.Generator().manual_seed(0))
    scale = args.head_dim**-0.5
    ref = da.decode_attention(q, k, v, tables, lens, scale, num_splits=1).float()
    console = Console()
    console.print(f"copy bandwidth {hw.bandwidth / 1e12:.2f} TB/s; KV read {nbytes / 1e9:.2f} GB")
    table = Table("splits", "BLOCK_N, warps, stages", "us", "TB/s", "% of copy bw", "max err")
    rows, real = [], da.tile_configs
    for splits in map(int, args.splits.split(",")):
        ws = da.decode_workspace(args.seqs, args.heads, args.head_dim, splits, "cuda")
        for block_n, warps, stages in CONFIGS:
            config = dict(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
            da.tile_configs = lambda block_d, config=config: [config]
            paged_args._chosen.clear()

            def call(splits=splits, ws=ws):
                return da.decode_attention(
                    q, k, v, tables, lens, scale, num_splits=splits, workspace=ws
                )

            try:
                err = (call().float() - ref).abs().max().item()
                us = graph_seconds(call, replays=20) * 1e6
            except Exception as e:  # resources this GPU lacks: report, go on
                console.print(f"[red]{splits} {config}: {type(e).__name__}: {str(e)[:200]}")
                continue
            rate = nbytes / (us * 1e-6)
            rows.append(dict(splits=splits, **config, us=us, err=err))
            table.add_row(
                str(splits),
                f"{block_n}, {warps}, {stages}",
                f"{us:.1f}",
                f"{rate / 1e12:.2f}",
                f"{100 * rate / hw.bandwidth:.0f}%",
                f"{err:.3g}",
            )
    da.tile_configs = real
    console.print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(bandwidth=hw.bandwidth, bytes=nbytes, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
