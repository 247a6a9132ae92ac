"""The Triton fused MoE (engine/kernels/moe.py) on the GPU at real layer shapes, each call
against its floor: the bytes of the distinct experts the routing touches (plus x and the
output) over the copy bandwidth measured in the same run.

    python -m benchmarks.kernels.bench_moe [--out FILE.json] [--tokens 1,8,64,256]
    python -m benchmarks.kernels.bench_moe --weights bf16,int8,int4
    python -m benchmarks.kernels.bench_moe --shapes gpt-oss-20b --configs '[[16, 64, 128, 4, 3]]'

Each call is timed inside a CUDA graph (as decode runs it), cycling over the weights of
several layers so no layer's experts are still in L2 at its turn. Routing is uniform: each
token picks k distinct experts at random. Prints one row per (shape, weights, tokens, config):
microseconds per call, the floor, and the floor as a share of the time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.floor import measure_hardware
from engine.kernels import moe_gemv
from engine.kernels.moe import MoeConfig, config_for, fused_moe
from engine.timing import graph_seconds

# name -> (hidden, expert intermediate, experts, top-k, activation, biases), from the models'
# config.json (hidden_size, moe_intermediate_size / intermediate_size, num_experts /
# num_local_experts, num_experts_per_tok / top_k_experts; profiles/models holds them)
SHAPES = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, "silu", False),
    "gpt-oss-20b": (2880, 2880, 32, 4, "swiglu_oai", True),
    "gemma-4-26b-a4b": (2816, 704, 128, 8, "gelu_tanh", False),
}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEVICE = "cuda"
"""Where the weights and inputs are made (the timing is CUDA's)."""
L2_FLUSH_BYTES = 4 << 30
"""Weights of enough layers to cycle over that a layer's experts leave L2 (50 MiB) between
its turns."""


WEIGHTS = ("bf16", "int8", "int4")
INT4_GROUP = 64


def make_layers(shape: tuple, kind: str) -> list[dict]:
    """fused_moe's weight arguments for as many layers as L2_FLUSH_BYTES holds (two or more):
    experts in bf16, or int8 / int4 (group INT4_GROUP) in engine/quant/weight_format.py's
    layouts."""
    hidden, inter, experts, _, _, bias = shape
    count = max(2, L2_FLUSH_BYTES // (expert_bytes(shape, kind) * experts))
    return [make_layer(hidden, inter, experts, bias, kind) for _ in range(count)]


def make_layer(hidden: int, inter: int, experts: int, bias: bool, kind: str) -> dict:
    layer = {"code": torch.linspace(-1, 1, 16, device=DEVICE), "group_size": INT4_GROUP}
    if kind != "int4":
        layer = {}
    for name, rows, cols in (("gate_up", 2 * inter, hidden), ("down", hidden, inter)):
        size = (experts, rows, cols)
        if kind == "bf16":
            w = torch.randn(size, device=DEVICE, dtype=torch.bfloat16) / cols**0.5
        elif kind == "int8":
            w = torch.randint(-127, 128, size, device=DEVICE, dtype=torch.int8)
            layer[f"{name}_scales"] = torch.full(size[:2], 0.01 / cols**0.5, device=DEVICE)
        else:  # int4: two codes a byte, an fp32 scale a group
            w = torch.randint(0, 256, (*size[:2], cols // 2), device=DEVICE, dtype=torch.uint8)
            groups = (*size[:2], cols // INT4_GROUP)
            layer[f"{name}_scales"] = torch.full(groups, 1 / cols**0.5, device=DEVICE)
        layer[f"w_{name}"] = w
        if bias:
            layer[f"b_{name}"] = torch.randn(experts, rows, device=DEVICE, dtype=torch.bfloat16)
    return layer


def expert_bytes(shape: tuple, kind: str) -> int:
    """One expert's weight bytes as fused_moe reads them (weights, scales, biases)."""
    hidden, inter, _, _, _, bias = shape
    weights = 3 * inter * hidden
    nbytes = {"bf16": 2 * weights, "int8": weights + 4 * (2 * inter + hidden)}.get(kind)
    if nbytes is None:  # int4: half a byte a weight and an fp32 scale a group
        nbytes = weights // 2 + 4 * weights // INT4_GROUP
    return nbytes + (2 * (2 * inter + hidden) if bias else 0)


def floor_bytes(shape: tuple, ids: torch.Tensor, kind: str) -> int:
    """Bytes a call must move at least: each distinct expert's weights once, x read and the
    output written (bf16)."""
    distinct = ids.unique().numel()
    return distinct * expert_bytes(shape, kind) + 2 * ids.shape[0] * shape[0] * 2


def per_call_seconds(layers: list[dict], call: tuple, config: MoeConfig | None) -> float:
    """Seconds per fused_moe call on (x, topk_weights, topk_ids, activation), timed in one
    CUDA graph that calls it once per layer."""
    x, weights, ids, activation = call

    def all_layers():
        for layer in layers:
            w13, w2 = layer["w_gate_up"], layer["w_down"]
            quant = {key: v for key, v in layer.items() if key not in ("w_gate_up", "w_down")}
            fused_moe(x, w13, w2, weights, ids, activation, **quant, config=config)

    return graph_seconds(all_layers) / len(layers)


def bench_shape(
    name: str, kind: str, tokens: list[int], configs: list, bandwidth: float
) -> list[dict]:
    shape = SHAPES[name]
    hidden, _, experts, k, activation, _ = shape
    layers = make_layers(shape, kind)
    rows = []
    for t in tokens:
        x = torch.randn(t, hidden, device=DEVICE, dtype=torch.bfloat16)
        ids = torch.rand(t, experts, device=DEVICE).argsort(dim=1)[:, :k].contiguous()
        weights = torch.softmax(torch.randn(t, k, device=DEVICE), dim=-1)
        floor = floor_bytes(shape, ids, kind) / bandwidth
        for config in configs or [None]:  # None: the kernel's own choice
            seconds = per_call_seconds(layers, (x, weights, ids, activation), config)
            chosen = config or (None if t <= moe_gemv.MAX_TOKENS else config_for(t, k, experts))
            row = {
                "shape": name,
                "weights": kind,
                "tokens": t,
                "config": list(chosen) if chosen else "few-token GEMV",
                "distinct_experts": int(ids.unique().numel()),
                "us": seconds * 1e6,
                "floor_us": floor * 1e6,
                "of_floor": floor / seconds,
            }
            rows.append(row)
            print(
                f"{name:14} {kind:5} {t:4d} tokens {str(row['config']):24} "
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
    ap.add_argument("--weights", default="bf16", help="expert weights: of " + ",".join(WEIGHTS))
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
        for kind in args.weights.split(","):
            if kind not in WEIGHTS:
                ap.error(f"unknown weights {kind!r}; known: {', '.join(WEIGHTS)}")
            rows += bench_shape(name, kind, tokens, configs, bandwidth)
            torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"bandwidth": bandwidth, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
