"""Importing Triton kernel modules for tests: compiled on CUDA, under Triton's CPU interpreter
(TRITON_INTERPRET=1) otherwise."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def import_kernel_modules(specs: list[tuple[str, str]]) -> tuple:
    """Import engine.kernels.<name> for each (name, kernel attribute); without CUDA, under
    TRITON_INTERPRET=1. @triton.jit reads the flag when it decorates (triton's own tl.max at
    triton's import), so the flag is set first, and a module imported earlier in the other mode
    is reloaded, with every module after it (later ones may import helpers from earlier ones).
    The flag is restored afterwards (tests set it again around each test, as the interpreter
    also reads it while running), so other modules' triton_available() is unaffected."""
    saved = os.environ.get("TRITON_INTERPRET")
    if not HAS_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        triton = pytest.importorskip(
            "triton", reason="triton is not installed (pip install triton)"
        )
        import triton.language as tl

        if not HAS_CUDA and isinstance(tl.max, triton.runtime.JITFunction):
            pytest.skip(
                "triton was imported before TRITON_INTERPRET=1 was set and there is no "
                "GPU: run with TRITON_INTERPRET=1",
                allow_module_level=True,
            )
        mods, stale = [], False
        for name, kernel in specs:
            mod = importlib.import_module(f"engine.kernels.{name}")
            is_jit = isinstance(getattr(mod, kernel), triton.runtime.JITFunction)
            stale = stale or is_jit == (not HAS_CUDA)
            if stale:
                mod = importlib.reload(mod)
            mods.append(mod)
        return tuple(mods)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
