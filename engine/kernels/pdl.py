"""Programmatic dependent launch (PDL, Hopper and later) for the batch-1 decode kernels.

A decode step at batch 1 is a chain of short kernels; each GEMV used to pay a few microseconds
of launch, ramp-up and tail before its first weight bytes arrived (H200, profiled: about 4 us
on the int8 o_proj's 7.8 us). With PDL a kernel launched with `launch_pdl=True` may start while
the kernel before it still runs, once that one's programs have all called
`gdc_launch_dependents`. The rule that keeps it correct, in every kernel here that takes part:

- a kernel launched with PDL loads only what no earlier kernel writes (weights, scales) before
  `gdc_wait()`, and reads its inputs and writes anything only after it; `gdc_wait` returns once
  the kernel before has finished and its writes are visible, so the order of the whole chain
  holds transitively;
- a kernel that lets the next one start early calls `gdc_launch_dependents()` first thing; it
  need not be launched with PDL itself (launched plainly, it still waits for its own
  predecessor in full).

Kernels take a `PDL: tl.constexpr` and guard both calls with it, so the CPU interpreter (which
has no GDC) and older GPUs compile them out. APPLIANCE_PDL=0 turns PDL off.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from engine.env import env_flag
from engine.kernels import interpreting


@triton.jit
def enter(PDL: tl.constexpr):
    """First thing in a short kernel launched with PDL: let the next kernel launch, then wait
    for the one before (nothing read or written before this)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


def enabled(x: torch.Tensor) -> bool:
    """Launch with PDL for this kernel call: x (the activations, one row per token or
    sequence) holds one row, as in batch-1 decode, on a CUDA device of compute capability 9.0
    or later, not under the interpreter, and APPLIANCE_PDL is not 0. Bigger batches run long
    kernels whose launch gaps matter less; they keep plain launches (workload A measured
    10,687 out tok/s with PDL on every launch, below its earlier 11,660-12,119 range; not
    shown to be PDL's doing, so not risked)."""
    return (
        x.is_cuda and x.shape[0] == 1 and _device_supports(x.device.index or 0) and _switched_on()
    )


@functools.cache
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def _switched_on() -> bool:
    if interpreting():
        return False
    return env_flag("APPLIANCE_PDL", default=True)
