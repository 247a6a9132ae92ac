"""Every Triton kernel of the engine: paged attention (prefill, decode, the layer variants, the
KV-cache write), GEMV and weight-only quantized GEMV/GEMM and dequantization, fused MoE, Gated
DeltaNet (the delta rule, conv1d), RoPE, RMSNorm and SiLU-and-mul; the pure-PyTorch references
they are tested against, which are also the CPU path (torch_ref, moe_ref, gdn_ref); and here,
whether Triton can run at all. Leaves: they import torch, triton, each other and engine.env."""

from __future__ import annotations

import functools

from engine.env import env_flag


@functools.cache
def _triton_imports() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install failing at import time
        return False
    return True


def interpreting() -> bool:
    """TRITON_INTERPRET is set: kernels run in Triton's CPU interpreter (no inline PTX, no
    grid dependency control)."""
    return env_flag("TRITON_INTERPRET", default=False)


def triton_available() -> bool:
    """True when the Triton kernels can run here: triton imports and CUDA is available, or
    TRITON_INTERPRET=1 (Triton's CPU interpreter: the kernels then take CPU tensors)."""
    if not _triton_imports():
        return False
    if interpreting():
        return True
    import torch

    return torch.cuda.is_available()


@functools.cache
def fused_kernels_enabled() -> bool:
    """Fused Triton kernels for RMSNorm, RoPE and SiLU-and-mul run on CUDA tensors (CUDA is
    available and Triton imports); the plain PyTorch ops everywhere else."""
    import torch

    return torch.cuda.is_available() and triton_available()
