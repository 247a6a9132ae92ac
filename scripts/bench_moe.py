"""The Triton fused MoE (engine/kernels/moe.py) on the GPU at real layer shapes, each call
against its floor: the bytes of the distinct experts the routing touches (plus x and the
output) over the copy bandwidth measured in the same run.

    PYTHONPATH=. python scripts/bench_moe.py [--out FILE.json] [--tokens 1,8,64,256]
    PYTHONPATH=. python scripts/bench_moe.py --shapes gpt-oss-20b --configs '[[16, 64, 128, 4, 3]]'

Each call is timed inside a CUDA graph (as decode runs it), cycling over the weights of
several layers so no layer's experts are still in L2 at its turn. Routing is uniform: each
token picks k distinct experts at random. Prints one row per (shape, tokens, config):
microseconds per call, the floor, and the floor as a share of the time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.kernels.moe import MoeConfig, config_for, fused_moe  # noqa: E402
from engine.timing import graph_seconds  # noqa: E402
from scripts.bench_floor import measure_hardware  # noqa: E402

# name -> (hidden, expert intermediate, experts, top-k, activation, biases), from the models'
# config.json (hidden_size, moe_intermediate_size / intermediate_size, num_experts /
# num_local_experts, num_experts_per_tok)
SHAPES = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, "silu", False),
    "gpt-oss-20b": (2880, 2880, 32, 4, "swiglu_oai", True),
}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
L2_FLUSH_BYTES = 4 << 30
"""Weights of enough layers to cycle over that a layer's experts leave L2 (50 MiB) between
its turns."""


def make_layers(shape: tuple, dtype: torch.dtype) -> list[tuple]:
    """(w_gate_up, w_down, b_gate_up, b_down) of as many layers as L2_FLUSH_BYTES holds (two
    or more)."""
    hidden, inter, experts, _, _, bias = shape
    layer_bytes = 3 * experts * inter * hidden * dtype.itemsize
    count = max(2, L2_FLUSH_BYTES // layer_bytes)
    layers = []
    for _ in range(count):
        w13 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=dtype) / hidden**0.5
        w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=dtype) / inter**0.5
        b13 = torch.randn(experts, 2 * inter, device="cuda", dtype=dtype) if bias else None
        b2 = torch.randn(experts, hidden, device="cuda", dtype=dtype) if bias else None
        layers.append((w13, w2, b13, b2))
    return layers


def floor_bytes(shape: tuple, ids: torch.Tensor, dtype: torch.dtype) -> int:
    """Bytes a call must move at least: each distinct expert's weights (and biases) once, x
    read and the output written."""
    hidden, inter, _, _, _, bias = shape
    per_expert = 3 * inter * hidden + (2 * inter + hidden if bias else 0)
    distinct = ids.unique().numel()
    return (distinct * per_expert + 2 * ids.shape[0] * hidden) * dtype.itemsize


def per_call_seconds(layers: list[tuple], call: tuple, config: MoeConfig) -> float:
    """Seconds per fused_moe call on (x, topk_weights, topk_ids, activation), timed in one
    CUDA graph that calls it once per layer."""
    x, weights, ids, activation = call

    def all_layers():
        for w13, w2, b13, b2 in layers:
            fused_moe(x, w13, w2, weights, ids, activation, b13, b2, config=config)

    return graph_seconds(all_layers) / len(layers)


def bench_shape(name: str, tokens: list[int], configs: list, bandwidth: float) -> list[dict]:
    shape = SHAPES[name]
    hidden, _, experts, k, activation, _ = shape
    dtype = torch.bfloat16
    layers = make_layers(shape, dtype)
    rows = []
    for t in tokens:
        x = torch.randn(t, hidden, device="cuda", dtype=dtype)
        ids = torch.rand(t, experts, device="cuda").argsort(dim=1)[:, :k].contiguous()
        weights = torch.softmax(torch.randn(t, k, device="cuda"), dim=-1)
        nbytes = floor_bytes(shape, ids, dtype)
        for config in configs or [config_for(t, k, experts)]:
            seconds = per_call_seconds(layers, (x, weights, ids, activation), config)
            floor = nbytes / bandwidth
            row = {
                "shape": name,
                "tokens": t,
                "config": list(config),
                "distinct_experts": int(ids.unique().numel()),
                "us": seconds * 1e6,
                "floor_us": floor * 1e6,
                "of_floor": floor / seconds,
            }
            rows.append(row)
            print(
                f"{name:14} {t:4d} tokens {str(tuple(config)):24} "
                f"{row['distinct_experts']:4d} experts {row['us']:9.1f} us  "
                f"floor {row['floor_us']:8.1f} us  {100 * row['of_floor']:5.1f}% of floor",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="which of " + ",".join(SHAPES))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts")
    ap.add_argument(
        "--configs",
        default=None,
        help="JSON list of [BLOCK_M, BLOCK_N, BLOCK_K, warps, stages] to time at every row "
        "(default: the kernel's own choice per row)",
    )
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe.py needs a CUDA GPU", file=sys.stderr)
        return 1
    configs = [MoeConfig(*c) for c in json.loads(args.configs or "[]")]
    tokens = [int(t) for t in args.tokens.split(",")]
    bandwidth = measure_hardware(torch.device("cuda"), torch.bfloat16).bandwidth
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
    rows = []
    for name in args.shapes.split(","):
        if name not in SHAPES:
            ap.error(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
        rows += bench_shape(name, tokens, configs, bandwidth)
        torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"bandwidth": bandwidth, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
