"""Timing a device operation: the helpers every benchmark and measured kernel choice use."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def seconds_per_call(
    fn: Callable[[], object], device: torch.device | str, iters: int, warmup: int = 3
) -> float:
    """Mean seconds of fn() over `iters` calls after `warmup` calls: CUDA events on a GPU
    (device time, queued back to back), wall time elsewhere."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters
    torch.cuda.synchronize(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / iters


def graph_seconds(fn: Callable[[], object], replays: int = 5) -> float:
    """Mean seconds of one replay of fn() captured in a CUDA graph: device time without the
    per-launch host cost, as decode steps run their kernels. fn runs once outside the capture
    first (Triton compiles, cuBLAS picks its kernels). Not while another capture is running."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    seconds = seconds_per_call(graph.replay, "cuda", replays, warmup=1)
    del graph
    return seconds


def fastest_config(configs: list, call, items: list, ref: torch.Tensor):
    """The config c of `configs` for which call(c, item) for every item, replayed in one CUDA
    graph, takes least time; a config whose output for items[0] is not close to `ref`, or that
    this GPU cannot run (resources), is skipped. None if none ran."""
    best, best_s = None, float("inf")
    atol = 2e-2 * max(1.0, ref.abs().max().item())  # 16-bit rounding of large sums
    for cfg in configs:
        try:
            got = call(cfg, items[0]).float()
            if not torch.allclose(got, ref, rtol=2e-2, atol=atol):
                continue

            def all_items(cfg=cfg):
                for item in items:
                    call(cfg, item)

            s = graph_seconds(all_items)
        except Exception:  # resources this GPU lacks for the config: skip it
            continue
        if s < best_s:
            best, best_s = cfg, s
    return best
