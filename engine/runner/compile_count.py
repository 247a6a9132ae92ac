"""The count of Triton kernels compiled in this process: a listener on Triton's compiler that
adds one per kernel variant built and remembers which kernel and specialisation it was, so an
engine can say how many compiled after its warm-up, and why.

Triton calls `triton.knobs.compilation.listener` from `triton.compiler.compile` each time the
JIT builds a kernel variant it has not yet built in this process (Triton 3.6 and 3.9: a first
call with new argument types, constexpr values or specialisations), whether the binary came
from the on-disk cache (`cache_hit=True`) or from a compile. Launches of a variant already
built never reach it, so the listener costs the step loop nothing. With no Triton, or a Triton
without that listener (before 3.4), the count is unknown (None); with TRITON_INTERPRET=1
kernels run in the interpreter and nothing compiles.

What the listener is given (the same in 3.6 and 3.9): `src`, the `triton.compiler.ASTSource`
the JIT built (`.name`; `.fn.arg_names`; `.signature`, argument name -> type, "constexpr" for
constexprs and for ints Triton specialised on the value 1; `.constants`, (index,) -> value;
`.attrs`, (index,) -> [["tt.divisibility", 16]] for pointers and ints it took as multiples of
16), and `metadata`, the compiled kernel's metadata as a dict (`num_warps`, `num_stages`, ...).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["CompileCounter", "CompileWatch", "Variant", "counter", "install", "total"]


@dataclass(frozen=True)
class Variant:
    """One kernel variant Triton built: the listener keeps the source object and two numbers,
    and formats them only when asked (describe)."""

    src: object
    num_warps: int | None
    num_stages: int | None
    cache_hit: bool

    @property
    def kernel(self) -> str:
        return str(getattr(self.src, "name", "?"))

    def describe(self) -> str:
        """The constexpr values, the ints Triton specialised on the value 1, the arguments it
        took as 16-divisible / 16-byte aligned, the argument types and the launch options,
        e.g. `constexprs BLOCK=64 PDL=False; value 1: n; %16: x_ptr out_ptr; types
        x_ptr=*bf16 n=i32; num_warps=4 num_stages=3; compiled`."""
        src = self.src
        names = list(getattr(getattr(src, "fn", None), "arg_names", []))
        params = getattr(getattr(src, "fn", None), "params", [])
        declared = {p.name for p in params if getattr(p, "is_constexpr", False)}

        def name(path) -> str:
            i = path[0] if isinstance(path, tuple) and path else path
            label = names[i] if isinstance(i, int) and i < len(names) else str(i)
            return label + "".join(f"[{j}]" for j in path[1:]) if isinstance(path, tuple) else label

        constants = getattr(src, "constants", {}) or {}
        constexprs = " ".join(
            f"{name(p)}={v}" for p, v in constants.items() if name(p).split("[")[0] in declared
        )
        ones = " ".join(name(p) for p in constants if name(p).split("[")[0] not in declared)
        aligned = " ".join(name(p) for p, a in (getattr(src, "attrs", {}) or {}).items() if a)
        types = " ".join(
            f"{k}={v}" for k, v in (getattr(src, "signature", {}) or {}).items() if v != "constexpr"
        )
        how = "from the disk cache" if self.cache_hit else "compiled"
        return (
            f"constexprs {constexprs or '-'}; value 1: {ones or '-'}; %16: {aligned or '-'}; "
            f"types {types or '-'}; num_warps={self.num_warps} num_stages={self.num_stages}; "
            f"{how}"
        )


@dataclass
class CompileCounter:
    """Kernel variants built in this process since the listener was installed."""

    total: int = 0
    """Every variant built (from the disk cache or compiled)."""
    disk_cache_hits: int = 0
    """Those whose binary Triton's on-disk cache already held."""
    variants: list[Variant] = field(default_factory=list)
    """Each variant built, in order: variants[i] is the (i + 1)-th of `total`."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # Triton may compile on worker threads (async compile)
        self._previous = None

    def on_compile(self, *, src=None, metadata=None, cache_hit: bool = False, **details) -> None:
        """Triton's CompilationListener: count and remember one variant, then call the
        listener this one replaced (if any) with the same arguments."""
        meta = metadata if isinstance(metadata, dict) else {}
        variant = Variant(src, meta.get("num_warps"), meta.get("num_stages"), bool(cache_hit))
        with self._lock:
            self.total += 1
            self.disk_cache_hits += bool(cache_hit)
            self.variants.append(variant)
        if self._previous is not None:
            self._previous(src=src, metadata=metadata, cache_hit=cache_hit, **details)

    def since(self, start: int) -> list[Variant]:
        """The variants built after the first `start` (a `total` read earlier)."""
        with self._lock:
            return self.variants[start:]


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


class CompileWatch:
    """One engine's view of the counter: the variants built since the end of its warm-up, each
    logged once as a WARNING (a compile while serving is a stall someone waited through)."""

    def __init__(self) -> None:
        self.start: int | None = None
        self._logged: int | None = None

    def start_now(self) -> None:
        """Warm-up ended: count from here (nothing is counted without Triton's listener)."""
        self.start = self._logged = total()

    def log_new(self, logger) -> None:
        """One WARNING per variant built since the last call (cheap when there is none)."""
        if self._logged is None or counter.total <= self._logged:
            return
        for variant in counter.since(self._logged):
            logger.warning(
                "kernel %s compiled while serving: %s", variant.kernel, variant.describe()
            )
            self._logged += 1

    def since_start(self) -> list[str]:
        """Each variant built since the warm-up ended: "kernel: specialisation"."""
        if self.start is None:
            return []
        return [f"{v.kernel}: {v.describe()}" for v in counter.since(self.start)]

    def count(self) -> int | None:
        """How many variants were built since the warm-up ended; None when not counted."""
        return None if self.start is None else total() - self.start
