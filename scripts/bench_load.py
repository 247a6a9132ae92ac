"""Weight-load time of a checkpoint (engine.models.loader.load_model), one tensor after
another against the threads of ParallelCopy, with the checkpoint in the page cache (a first
load is not timed), beside the floor: checkpoint bytes / the host-to-device copy rate of one
pinned buffer (on the CPU, the host copy rate).

    .venv/bin/python scripts/bench_load.py FOLDER [--device cuda] [--dtype bfloat16] [--loads 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.models import loader  # noqa: E402
from engine.models.model_config import ModelConfig  # noqa: E402

GIB = 2**30


class OneAtATime:
    """Every copy in the loading thread (the load before ParallelCopy)."""

    def __enter__(self):
        return torch.Tensor.copy_

    def __exit__(self, *exc) -> None:
        return None


def seconds_to_load(folder: Path, dtype: torch.dtype, device: torch.device, loads: int) -> float:
    cfg = ModelConfig.from_folder(folder)
    times = []
    for _ in range(loads):
        start = time.perf_counter()
        model = loader.load_model(folder, cfg, 2048, dtype, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return statistics.median(times)


def copy_rate(device: torch.device, nbytes: int = GIB) -> float:
    """Bytes per second of one copy from a pinned host buffer to `device` (host to host on the
    CPU)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    dst.copy_(src)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return nbytes / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    files = loader._safetensors_files(args.folder)
    nbytes = sum(f.stat().st_size for f in files)
    seconds_to_load(args.folder, dtype, device, 1)  # into the page cache, kernels loaded
    parallel = loader.ParallelCopy
    results = {}
    for name, copier in [("one at a time", OneAtATime), ("parallel", parallel)]:
        loader.ParallelCopy = copier
        results[name] = seconds_to_load(args.folder, dtype, device, args.loads)
    loader.ParallelCopy = parallel
    floor = nbytes / copy_rate(device)
    print(f"{args.folder.name}: {nbytes / GIB:.2f} GiB in {len(files)} file(s) -> {device}")
    print(f"floor (pinned copy): {floor:.2f} s")
    for name, s in results.items():
        print(f"{name:>14}: {s:.2f} s, {nbytes / GIB / s:.2f} GiB/s, {floor / s:.0%} of the floor")


if __name__ == "__main__":
    main()
