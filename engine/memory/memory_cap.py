"""An artificial cap on usable device memory (APPLIANCE_MEMORY_CAP_GIB), to plan and run on a
large GPU as if it were a smaller one (an H200 behaving like a 24 GiB RTX 4090).

The probe and planner read the cap as the device's total; the engine reads it through
usable_mem_info and enforces it with the caching allocator's per-process fraction, so a plan that
overshoots fails with an out-of-memory error exactly where the smaller card would.
"""

from __future__ import annotations

import os

CAP_ENV = "APPLIANCE_MEMORY_CAP_GIB"
GIB = 1024**3


def memory_cap_bytes() -> int | None:
    """The cap in bytes, or None when unset; raises ValueError for a value that is not > 0."""
    raw = os.environ.get(CAP_ENV, "").strip()
    if not raw:
        return None
    try:
        cap = float(raw)
    except ValueError:
        raise ValueError(f"{CAP_ENV}={raw!r} is not a number of GiB") from None
    if cap <= 0:
        raise ValueError(f"{CAP_ENV} must be > 0 GiB, got {raw}")
    return int(cap * GIB)


def capped(free: int, total: int) -> tuple[int, int]:
    """(free, total) as seen under the cap: the total is the cap, and free loses what the cap
    hides (memory past the cap is not ours to use)."""
    cap = memory_cap_bytes()
    if cap is None or cap >= total:
        return free, total
    return max(0, free - (total - cap)), cap


def usable_mem_info(device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device, under the cap when one is set."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return capped(free, total)


def apply_memory_cap(device) -> None:
    """Make the cap real: the caching allocator may not grow past the cap minus the memory it
    does not manage (CUDA context, library workspaces), as on a card of that size."""
    cap = memory_cap_bytes()
    if cap is None or device.type != "cuda":
        return
    import torch

    free, total = torch.cuda.mem_get_info(device)
    if cap >= total:
        return
    outside = total - free - torch.cuda.memory_reserved(device)  # context, other processes
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(max(0.01, (cap - outside) / total), index)
