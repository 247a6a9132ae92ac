"""Screen helpers for the dashboard tests: the screen as plain text, and waiting for the app."""

from __future__ import annotations

import asyncio
import io


def screen_text(app) -> str:
    """The current screen as plain text, the way a terminal without colour shows it."""
    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width,
        height=height,
        record=True,
        color_system=None,
        file=io.StringIO(),
        legacy_windows=False,
    )
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


async def wait_for(pilot, predicate, timeout: float = 10.0, what: str = "") -> None:
    """Let the app run until predicate() holds (or fail after `timeout` seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what or predicate}"
        await pilot.pause(0.02)
