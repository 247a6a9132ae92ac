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


def config_errors() -> tuple[type[Exception], ...]:
    """The errors a candidate kernel config raises where this device cannot run it, which
    timing skips: Triton's OutOfResources, raised when a compiled config needs more shared
    memory, tensor memory or threads a block than the device gives (CompiledKernel.
    _init_handles in triton/compiler/compiler.py, Triton 3.6 and 3.9). Compile and ptxas
    errors come from the kernel's code, not from the device (tests/test_sm90_compile.py
    compiles the kernels for sm_90 in CI): they propagate, as does everything else."""
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:  # no Triton: no Triton kernel can be timed, or fail
        return ()
    return (OutOfResources,)


def fastest_config(configs: list, call, items: list, ref: torch.Tensor):
    """The config c of `configs` for which call(c, item) for every item, replayed in one CUDA
    graph, takes least time; a config whose output for items[0] is not close to `ref`, or that
    this device cannot run (config_errors), is skipped. None if none ran."""
    best, best_s = None, float("inf")
    ref = ref.float()  # outputs are compared in fp32, whatever their dtype
    atol = 2e-2 * max(1.0, ref.abs().max().item())  # 16-bit rounding of large sums
    skipped = config_errors()
    for cfg in configs:

        def all_items(cfg=cfg):
            for item in items:
                call(cfg, item)

        try:
            got = call(cfg, items[0]).float()
            if not torch.allclose(got, ref, rtol=2e-2, atol=atol):
                continue
            s = graph_seconds(all_items)
        except skipped:
            continue
        if s < best_s:
            best, best_s = cfg, s
    return best
