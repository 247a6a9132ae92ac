"""Batch-1 (M = 1) linear layers on the GPU, per Llama-3-8B shape: cuBLAS, our split-K bf16
GEMV per config, and the weight-only int8 / int4 kernels, each timed inside a CUDA graph (as
decode runs them) and against the copy bandwidth measured in the same run.

    PYTHONPATH=. python scripts/bench_gemv.py [--out FILE.json] [--m 1]

Prints one row per (shape, path): microseconds per call, bytes read / time, and that as a
share of the copy bandwidth; then the weight time of one decode token (32 layers + LM head)
per path, the part of workload B's step the GEMVs decide.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.kernels import gemv as gemv_mod  # noqa: E402
from engine.kernels import wq_gemv  # noqa: E402
from scripts.bench_floor import measure_hardware  # noqa: E402

# (name, N, K, count per token) for Llama-3-8B: 32 layers and the LM head
SHAPES = [
    ("qkv", 6144, 4096, 32),
    ("o", 4096, 4096, 32),
    ("gate_up", 28672, 4096, 32),
    ("down", 4096, 14336, 32),
    ("lm_head", 128256, 4096, 1),
]
NF4 = torch.tensor(
    [-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0,
     0.0796, 0.1609, 0.2461, 0.3379, 0.4407, 0.5626, 0.7230, 1.0]
)  # fmt: skip


def graph_us(fn, calls: int = 20, replays: int = 10) -> float:
    """Microseconds per fn() call, fn captured `calls` times in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) * 1e3 / (replays * calls)


def variants(n: int, k: int, m: int, dtype: torch.dtype):
    """(path, bytes read, fn, reference fn) for one shape."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    w = (torch.randn(n, k, device="cuda", dtype=dtype, generator=g) / k**0.5).contiguous()
    wbytes = w.numel() * w.element_size()
    yield "cublas", wbytes, lambda: F.linear(x, w), None
    if m == 1:
        for cfg in gemv_mod.CONFIGS:
            yield f"gemv{cfg}", wbytes, lambda cfg=cfg: gemv_mod.gemv(x, w, None, cfg), None
    q8 = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
    s8 = torch.rand(n, device="cuda", generator=g) / 127
    yield (
        "int8",
        q8.numel() + s8.numel() * 4,
        lambda: wq_gemv.wq_matmul(x, q8, s8),
        (lambda: F.linear(x, (q8.float() * s8[:, None]).to(dtype))),
    )
    group = 64
    q4 = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8, generator=g)
    s4 = torch.rand(n, k // group, device="cuda", generator=g)
    code = NF4.cuda()
    from engine.models.quant import wq_matmul_ref

    yield (
        "int4",
        q4.numel() + s4.numel() * 4,
        (lambda: wq_gemv.wq_matmul(x, q4, s4, code, group_size=group)),
        lambda: wq_matmul_ref(x, q4, s4, code, None, group),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--m", type=int, default=1, help="rows of x (1 = batch-1 decode)")
    args = ap.parse_args(argv)
    hw = measure_hardware(torch.device("cuda"), torch.bfloat16)
    bw = hw.bandwidth  # bytes read + written per second by a copy: the floor's rate
    console = Console()
    console.print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    table = Table("shape", "N x K", "path", "us", "GB/s", "% of copy bw", "max err")
    rows, per_token = [], {}
    for name, n, k, count in SHAPES:
        for path, nbytes, fn, ref in variants(n, k, args.m, torch.bfloat16):
            try:
                err = (fn().float() - ref().float()).abs().max().item() if ref else 0.0
                us = graph_us(fn)
            except Exception as e:  # a config this GPU cannot run: report it, go on
                table.add_row(name, f"{n}x{k}", path, "error", str(e)[:60], "", "")
                continue
            rate = nbytes / (us * 1e-6)
            rows.append(dict(shape=name, n=n, k=k, path=path, us=us, bytes=nbytes, err=err))
            table.add_row(
                name, f"{n}x{k}", path, f"{us:.1f}", f"{rate / 1e9:.0f}",
                f"{100 * rate / bw:.0f}%", f"{err:.3g}",
            )  # fmt: skip
            family = path.split("(")[0]
            best = per_token.setdefault(family, {})
            best[name] = min(best.get(name, float("inf")), us * count)
    console.print(table)
    for family, times in per_token.items():
        if len(times) == len(SHAPES) or family in ("int8", "int4"):
            total = sum(times.values()) / 1e3
            console.print(f"{family}: weight GEMVs of one decode token {total:.2f} ms ({times})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = dict(bandwidth=hw.bandwidth, matmul_flops=hw.matmul_flops, rows=rows)
        args.out.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
