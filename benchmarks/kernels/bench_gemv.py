"""Batch-1 (M = 1) linear layers on the GPU, per Llama-3-8B shape: cuBLAS, our split-K bf16
GEMV per config, and the weight-only int8 / int4 kernels (bitsandbytes gives NF4's table),
each timed inside a CUDA graph (as decode runs them: once per layer's own weight, so none is
served from L2) and against the copy bandwidth measured in the same run.

    python -m benchmarks.kernels.bench_gemv [--out FILE.json] [--m 1]
    python -m benchmarks.kernels.bench_gemv --m 32 --paths cublas,int8,int4  # a decode batch
    python -m benchmarks.kernels.bench_gemv --paths int4 --configs '{"int4": [[128, 2, 8, 3]]}'

Prints one row per (shape, path): microseconds per call, bytes read / time, and that as a
share of the copy bandwidth; then the weight time of one decode token (32 layers + LM head)
per path, the part of workload B's step the GEMVs decide.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from benchmarks.floor import measure_hardware
from engine.kernels import dequant, wq_gemm, wq_gemv
from engine.kernels import gemv as gemv_mod
from engine.quant.bnb import code_table
from engine.quant.reference import wq_matmul_ref
from engine.timing import graph_seconds

# (name, N, K, count per token) for Llama-3-8B: 32 layers and the LM head
SHAPES = [
    ("qkv", 6144, 4096, 32),
    ("o", 4096, 4096, 32),
    ("gate_up", 28672, 4096, 32),
    ("down", 4096, 14336, 32),
    ("lm_head", 128256, 4096, 1),
]


def per_call_us(call, weights: list) -> float:
    """Microseconds per call(w), timed in one CUDA graph that calls it once per weight in
    `weights` (distinct tensors, as a decode step's layers: none is still in L2 at its turn)."""

    def all_weights():
        for w in weights:
            call(w)

    return graph_seconds(all_weights) * 1e6 / len(weights)


PATHS = ("cublas", "gemv", "int8", "int4")


def variants(n: int, k: int, m: int, copies: int, dtype: torch.dtype, paths=PATHS):
    """(path, bytes read per call, us per call, max error against its reference)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    if "cublas" in paths or "gemv" in paths:
        yield from _bf16(x, n, k, copies, g, paths)
    if "int8" in paths:
        q8 = [
            torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
            for _ in range(copies)
        ]
        s8 = torch.rand(n, device="cuda", generator=g) / 127
        yield from _quantized("int8", x, [(q, s8, None, None, 0) for q in q8], n * k + n * 4)
        del q8
    if "int4" in paths:
        group, code = 64, code_table("nf4").cuda()
        q4 = [
            torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8, generator=g)
            for _ in range(copies)
        ]
        s4 = torch.rand(n, k // group, device="cuda", generator=g)
        layers = [(q, s4, code, None, group) for q in q4]
        yield from _quantized("int4", x, layers, n * k // 2 + s4.numel() * 4)


def _bf16(x: torch.Tensor, n: int, k: int, copies: int, g: torch.Generator, paths):
    ws = [torch.randn(n, k, device="cuda", dtype=x.dtype, generator=g) for _ in range(copies)]
    wbytes = n * k * 2
    if "cublas" in paths:
        yield "cublas", wbytes, per_call_us(lambda w: F.linear(x, w), ws), 0.0
    if x.shape[0] != 1 or "gemv" not in paths:
        return
    ref = F.linear(x, ws[0]).float()
    for cfg in gemv_mod.CONFIGS:

        def call(w, cfg=cfg):
            return gemv_mod.gemv(x, w, None, cfg)

        err = (call(ws[0]).float() - ref).abs().max().item()
        yield f"gemv{cfg}", wbytes, per_call_us(call, ws), err


def _quantized(kind: str, x: torch.Tensor, layers: list, nbytes: int):
    """Each split-K config of wq_gemv for these same-shape layers (one row); for a batch,
    the one-pass dequantization + cuBLAS, then each wq_gemm config of the batch's bucket."""
    ref = wq_matmul_ref(x, *layers[0]).float()
    if x.shape[0] > 1:
        yield from _batched(kind, x, layers, nbytes, ref)
        return
    for cfg in wq_gemv.CONFIGS[kind]:

        def call(layer, cfg=cfg):
            return wq_gemv.wq_gemv(x, *layer, cfg)

        yield f"{kind}{cfg}", nbytes, per_call_us(call, layers), _err(call, layers, ref)


def _batched(kind: str, x: torch.Tensor, layers: list, nbytes: int, ref: torch.Tensor):
    def deq(layer):
        return F.linear(x, dequant.dequantize(*layer[:3], layer[4], x.dtype), layer[3])

    yield f"{kind} dequant+cublas", nbytes, per_call_us(deq, layers), _err(deq, layers, ref)
    for cfg in wq_gemm.CONFIGS[kind].get(wq_gemm.bucket_for(x.shape[0]), []):  # none past 256

        def call(layer, cfg=cfg):
            return wq_gemm.wq_gemm(x, *layer, cfg)

        yield f"{kind}_gemm{cfg}", nbytes, per_call_us(call, layers), _err(call, layers, ref)


def _err(call, layers: list, ref: torch.Tensor) -> float:
    return (call(layers[0]).float() - ref).abs().max().item()


def _guarded(rows, console: Console):
    """The rows of a variants() generator until one fails (the error is printed)."""
    try:
        yield from rows
    except Exception as e:  # a kernel that does not compile or run here: report, go on
        console.print(f"[red]error: {type(e).__name__}: {str(e)[:300]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--m", type=int, default=1, help="rows of x (1 = batch-1 decode)")
    ap.add_argument("--paths", default=",".join(PATHS), help="which of " + ",".join(PATHS))
    ap.add_argument(
        "--configs",
        default=None,
        help='JSON {"int8"|"int4": [[BLOCK_N, BLOCK_K or groups, warps(, stages)], ...]}: '
        "time these split-K configs instead of wq_gemv.CONFIGS",
    )
    ap.add_argument(
        "--gemm-configs",
        default=None,
        help='JSON {"int8"|"int4": [[BLOCK_N, BLOCK_M, BLOCK_K, warps, stages, ahead], ...]}: '
        "time these wq_gemm configs (at --m's row bucket) instead of wq_gemm.CONFIGS",
    )
    args = ap.parse_args(argv)
    paths = tuple(p for p in args.paths.split(",") if p)
    if unknown := set(paths) - set(PATHS):
        ap.error(f"--paths: unknown {sorted(unknown)}; choose from {','.join(PATHS)}")
    for kind, configs in json.loads(args.configs or "{}").items():
        wq_gemv.CONFIGS[kind] = [tuple(c) for c in configs]
    for kind, configs in json.loads(args.gemm_configs or "{}").items():
        wq_gemm.CONFIGS[kind][wq_gemm.bucket_for(args.m)] = [tuple(c) for c in configs]
    hw = measure_hardware(torch.device("cuda"), torch.bfloat16)
    bw = hw.bandwidth  # bytes read + written per second by a copy: the floor's rate
    console = Console(width=160)
    console.print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    table = Table("shape", "N x K", "path", "us", "GB/s", "% of copy bw", "max err")
    rows, per_token = [], {}
    shapes = SHAPES if args.m == 1 else SHAPES[:-1]  # the LM head runs once a step, 16-bit
    for name, n, k, count in shapes:
        for path, nbytes, us, err in _guarded(
            variants(n, k, args.m, min(count, 32), torch.bfloat16, paths), console
        ):
            rate = nbytes / (us * 1e-6)
            rows.append(dict(shape=name, n=n, k=k, path=path, us=us, bytes=nbytes, err=err))
            table.add_row(
                name,
                f"{n}x{k}",
                path,
                f"{us:.1f}",
                f"{rate / 1e9:.0f}",
                f"{100 * rate / bw:.0f}%",
                f"{err:.3g}",
            )
            family = path.split("(")[0]
            best = per_token.setdefault(family, {})
            best[name] = min(best.get(name, float("inf")), us * count)
    console.print(table)
    for family, times in per_token.items():
        if family in ("cublas", "int8", "int4") or len(times) == len(shapes):  # best per shape
            total = sum(times.values()) / 1e3
            console.print(f"{family}: weight GEMVs of one decode token {total:.2f} ms ({times})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = dict(bandwidth=hw.bandwidth, matmul_flops=hw.matmul_flops, rows=rows)
        args.out.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
