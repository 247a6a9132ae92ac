"""The count of Triton kernels compiled in this process: a listener on Triton's compiler that
adds one per kernel variant built, so an engine can say how many compiled after its warm-up.

Triton calls `triton.knobs.compilation.listener` from `triton.compiler.compile` each time the
JIT builds a kernel variant it has not yet built in this process (Triton 3.6 and 3.9: a first
call with new argument types, constexpr values or specialisations), whether the binary came
from the on-disk cache (`cache_hit=True`) or from a compile. Launches of a variant already
built never reach it, so the listener costs the step loop nothing. With no Triton, or a Triton
without that listener (before 3.4), the count is unknown (None); with TRITON_INTERPRET=1
kernels run in the interpreter and nothing compiles.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["CompileCounter", "counter", "install", "total"]


@dataclass
class CompileCounter:
    """Kernel variants built in this process since the listener was installed."""

    total: int = 0
    """Every variant built (from the disk cache or compiled)."""
    disk_cache_hits: int = 0
    """Those whose binary Triton's on-disk cache already held."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # Triton may compile on worker threads (async compile)
        self._previous = None

    def on_compile(self, *, cache_hit: bool = False, **details) -> None:
        """Triton's CompilationListener: count one variant, then call the listener this one
        replaced (if any) with the same arguments."""
        with self._lock:
            self.total += 1
            self.disk_cache_hits += bool(cache_hit)
        if self._previous is not None:
            self._previous(cache_hit=cache_hit, **details)


counter = CompileCounter()
"""The process's one counter: Triton's listener is process-wide, so every engine in the
process reads the same total and keeps its own starting point (LLMEngine keeps the total at
the end of its warm-up)."""

_installed: bool | None = None


def install() -> bool:
    """Put `counter` on Triton's compilation listener (once per process; a listener already
    there is kept and called after it). True when compiles are counted; False without Triton
    or without the listener."""
    global _installed
    if _installed is not None:
        return _installed
    try:
        from triton import knobs
    except Exception:  # no Triton, an older one without knobs, or a broken install
        _installed = False
        return False
    compilation = getattr(knobs, "compilation", None)
    if compilation is None or not hasattr(compilation, "listener"):
        _installed = False
        return False
    if compilation.listener is not counter.on_compile:
        counter._previous = compilation.listener
        compilation.listener = counter.on_compile
    _installed = True
    return True


def total() -> int | None:
    """Kernel variants built in this process so far; None when they cannot be counted."""
    return counter.total if install() else None
