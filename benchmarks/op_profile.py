"""Where a benchmark's step spends its time: `top_ops` runs a function under torch.profiler and
lists the operators with the most self time on the device (CUDA) or the CPU, against the wall
time of the call (the difference is launch gaps and host work)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def top_ops(fn: Callable[[], object], n: int, device: str) -> list[str]:
    """Report lines: the wall time of fn(), the sum of the operators' self time, and the n
    operators with the most self time (calls, milliseconds, share)."""
    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1000
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    total_ms = sum(getattr(e, key) for e in events) / 1000
    where = "device" if cuda else "CPU"
    lines = [
        f"profiled call: wall {wall_ms:.1f} ms, {where} self time of all ops {total_ms:.1f} ms"
    ]
    for e in events[:n]:
        ms = getattr(e, key) / 1000
        share = ms / total_ms if total_ms else 0.0
        lines.append(f"  {ms:9.2f} ms {share:6.1%} {e.count:6d} x  {e.key[:90]}")
    return lines
