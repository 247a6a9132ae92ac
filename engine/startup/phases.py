"""Start-up phases: the wall time each phase of an engine's start-up took (GGUF conversion,
config, plan, tokenizer, weight load, KV allocation, kernel choice, graph capture, warm-up,
memory check), kept as a plain dict of floats so it pickles and reads in /v1/stats; and what
each phase is called where a user watches a start (the server's progress and /health)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

WARMING_UP = "warming up"
PHASE_WORDS = {
    "start": "loading the model",
    "convert": "converting the GGUF file (once; later starts reuse it)",
    "config": "reading the model's config",
    "plan": "planning memory",
    "tokenizer": "loading the tokenizer",
    "load": "loading weights",
    "kv_alloc": "allocating the KV cache",
    "kernel_choice": WARMING_UP,
    "graph_capture": WARMING_UP,
    "memory_check": WARMING_UP,
    "warm_up": WARMING_UP,
    "spec_costs": WARMING_UP,
}
"""Each start-up phase in a user's words: "start" is an engine core's before its engine reports
a phase; the rest are StartupTimer phases (the core's warm-up request is "warm_up" too)."""
WEIGHTS_PHASE = "load"
"""The phase that starts reading the weights: a ValueError before it is a refused configuration
(a model that is not there, pins that cannot fit), not a failed load."""


def phase_words(name: str) -> str:
    """What a user is told the engine is doing during phase `name`."""
    return PHASE_WORDS.get(name, name.replace("_", " "))


class StartupTimer:
    """Seconds per named phase, in the order the phases first ended (a phase that holds
    others comes after them). A phase entered inside another pauses the outer one, so the
    phases never count the same second twice and add up to the time spent inside them.

    `on_phase` is called with a phase's name each time it begins or, after a phase inside it,
    resumes (the engine core reports the phases to the front end as they happen)."""

    def __init__(self, on_phase: Callable[[str], None] | None = None) -> None:
        self.on_phase = on_phase
        self.seconds: dict[str, float] = {}
        self._order: dict[str, None] = {}  # phases in the order they first ended
        self._started = time.perf_counter()
        self._stack: list[tuple[str, float]] = []  # (phase, when it last resumed)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        now = time.perf_counter()
        if self._stack:
            self._pause(now)
        self.seconds.setdefault(name, 0.0)
        self._stack.append((name, now))
        self._tell(name)
        try:
            yield
        finally:
            now = time.perf_counter()
            self._pause(now)
            self._stack.pop()
            self._order.setdefault(name)
            if self._stack:
                outer, _ = self._stack.pop()
                self._stack.append((outer, now))
                self._tell(outer)

    def _tell(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)

    def _pause(self, now: float) -> None:
        name, resumed = self._stack[-1]
        self.seconds[name] += now - resumed
        self._stack[-1] = (name, now)

    def report(self) -> dict[str, float]:
        """Every phase's seconds, then "total": the seconds since the timer was made."""
        return {
            **{name: self.seconds[name] for name in self._order},
            "total": time.perf_counter() - self._started,
        }


def startup_line(seconds: dict[str, float]) -> str:
    """'startup: load 3.2 s, plan 0.1 s, ..., total 14.0 s'"""
    parts = ", ".join(f"{name.replace('_', ' ')} {s:.1f} s" for name, s in seconds.items())
    return f"startup: {parts}"
