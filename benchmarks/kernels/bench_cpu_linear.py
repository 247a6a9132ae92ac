"""float32 Linears on the CPU: F.linear (MKL's sgemm in the usual torch build) against oneDNN's
linear (torch.ops.mkldnn._linear_pointwise, what engine/models/layers.py calls), for the
embedded SmolLM2-135M's projection shapes and its LM head, at several row counts. Prints
microseconds per call (median of repeated timings) and the largest difference.

    .venv/bin/python -m benchmarks.kernels.bench_cpu_linear [--rows 1,2,4,9,64,512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(1536, 576), (576, 1536), (576, 576), (49152, 576)]
"""(out, in): SmolLM2-135M's gate/up, down, q/o projections and its LM head."""


def _us(fn, calls: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,9,64,512")
    args = ap.parse_args()
    torch.manual_seed(0)
    onednn = torch.ops.mkldnn._linear_pointwise
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        for out, inp in SHAPES:
            weight = torch.randn(out, inp)
            calls = 5 if out > 10000 else 50
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, inp)
                diff = (F.linear(x, weight) - onednn(x, weight, None, "none", [], "")).abs().max()
                mkl = _us(lambda: F.linear(x, weight), calls)  # noqa: B023
                dnn = _us(lambda: onednn(x, weight, None, "none", [], ""), calls)  # noqa: B023
                print(
                    f"{out:6d} x {inp:4d}, {rows:4d} rows: F.linear {mkl:9.1f} us, oneDNN "
                    f"{dnn:9.1f} us ({mkl / dnn:4.2f}x), max difference {diff:.1e}"
                )


if __name__ == "__main__":
    main()
