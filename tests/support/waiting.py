"""Waiting on a condition in async tests: poll it until it holds or a timeout fails the test
(instead of a fixed sleep that races with the event loop and a loaded machine)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
    """Return once `predicate()` is true; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s: {what}"
        await asyncio.sleep(0.01)
