"""NVML access, the one reader of it and of CUDA_VISIBLE_DEVICES: `appliance profile`'s probe
(appliance.probe) and the server's GPU readings in /v1/stats (appliance.server.stats) find the
device CUDA numbers as this process does. The planner reads its device through torch, in the
process that runs the engine (engine.planner.device).

pynvml is imported when called, so this package imports without it; nothing here creates a
CUDA context, so the HTTP front end holds no GPU memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def load() -> Any:
    """pynvml, initialised. Raises what the import or nvmlInit raises (no library, no driver,
    no permission): each caller says in its own words what it does without NVML."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def visible_entry(index: int) -> str | None:
    """CUDA_VISIBLE_DEVICES' entry for the CUDA device this process numbers `index` (a physical
    index such as "3", or a UUID "GPU-..." / "MIG-..."); str(index) when the variable is unset;
    None when the variable hides that device (it lists fewer, or is empty)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return str(index)
    entries = [e.strip() for e in value.split(",") if e.strip()]
    return entries[index] if index < len(entries) else None


def handle(nvml: Any, index: int = 0, uuid: str | None = None) -> Any | None:
    """The NVML handle of the CUDA device this process numbers `index`, or of the device whose
    UUID torch reports (`uuid`, with or without the "GPU-" prefix); None when NVML cannot find
    it or CUDA_VISIBLE_DEVICES hides it."""
    if uuid is not None:
        entry = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    else:
        entry = visible_entry(index)
    if entry is None:
        return None
    if entry.isdigit():
        return read(nvml.nvmlDeviceGetHandleByIndex, int(entry))
    return read(nvml.nvmlDeviceGetHandleByUUID, entry)


def read(fn: Callable[..., Any], *args: Any) -> Any | None:
    """fn(*args), or None when it raises: a reading this board or driver does not give, or a
    GPU that went away."""
    try:
        return fn(*args)
    except Exception:
        return None


def text(value: Any) -> str | None:
    """An NVML string (bytes in older pynvml releases) as str."""
    return value.decode() if isinstance(value, bytes) else value
