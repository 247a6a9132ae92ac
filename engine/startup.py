"""Start-up phases: the wall time each phase of an engine's start-up took (config, plan,
tokenizer, weight load, KV allocation, kernel choice, graph capture, warm-up, memory check),
kept as a plain dict of floats so it pickles and reads in /v1/stats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StartupTimer:
    """Seconds per named phase, in the order the phases first ended (a phase that holds
    others comes after them). A phase entered inside another pauses the outer one, so the
    phases never count the same second twice and add up to the time spent inside them."""

    def __init__(self) -> None:
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
