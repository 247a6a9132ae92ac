"""Attention kernels: pure-PyTorch references (torch_ref) and Triton kernels for CUDA."""

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
