"""Snapshots of the main screen and a trace screen at 80x24 and 160x48, and of the per-key
table swapped in at 80x24 (`k`), from fixed documents and a fixed clock. Each is an SVG
(Textual's screenshot) plus its plain text; the text is always compared, the SVG when the
installed Textual is the one that recorded it (its rendering details change between releases).
TUI_SNAPSHOT_UPDATE=1 rewrites them."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
import textual

from engine.env import env_flag
from tests.support.tui_fakes import T0, make_doc
from tests.support.tui_screen import screen_text, wait_for
from tests.support.tui_sources import ReplaySource
from tui import DashboardApp
from tui.screens.trace import TraceScreen

SNAPSHOTS = Path(__file__).parent / "tui_snapshots"
VERSION_FILE = SNAPSHOTS / "textual_version.txt"
UPDATE = env_flag("TUI_SNAPSHOT_UPDATE", default=False)
NUM_DOCS = 12


async def capture(size: tuple[int, int], screen: str) -> tuple[str, str]:
    """(svg, text) of `screen` after NUM_DOCS documents."""
    app = DashboardApp(ReplaySource([make_doc(i) for i in range(NUM_DOCS)]), clock=lambda: T0)
    async with app.run_test(size=size) as pilot:
        last = 3723.0 + NUM_DOCS - 1
        await wait_for(pilot, lambda: app.view is not None and app.view.doc["uptime_s"] == last)
        if screen == "keys":
            await pilot.press("k")
        if screen == "trace":
            app.open_trace("req-done-e")
            await wait_for(
                pilot, lambda: isinstance(app.screen, TraceScreen) and app.screen.trace is not None
            )
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        return app.export_screenshot(title="appliance top"), screen_text(app)


def check(path: Path, actual: str, tmp_path: Path) -> None:
    if UPDATE or not path.exists():
        path.write_text(actual)
        if not UPDATE:
            pytest.fail(f"no snapshot yet: wrote {path}; check it and commit it")
        return
    if path.read_text() != actual:
        got = tmp_path / path.name
        got.write_text(actual)
        pytest.fail(f"{path.name} differs from the snapshot: see {got} (TUI_SNAPSHOT_UPDATE=1)")


@pytest.mark.parametrize(
    "screen, size",
    [
        ("main", (80, 24)),
        ("main", (160, 48)),
        ("trace", (80, 24)),
        ("trace", (160, 48)),
        ("keys", (80, 24)),
    ],
    ids=["main-80x24", "main-160x48", "trace-80x24", "trace-160x48", "keys-80x24"],
)
async def test_snapshot(screen: str, size: tuple[int, int], tmp_path: Path):
    svg, text = await capture(size, screen)
    name = f"{screen}_{size[0]}x{size[1]}"
    check(SNAPSHOTS / f"{name}.txt", text, tmp_path)
    if UPDATE:
        VERSION_FILE.write_text(textual.__version__ + "\n")
    recorded = VERSION_FILE.read_text().strip() if VERSION_FILE.exists() else None
    if UPDATE or recorded == textual.__version__:
        check(SNAPSHOTS / f"{name}.svg", svg, tmp_path)
    marks = {"main": "SmolLM2-135M-Instruct", "trace": "req-done-e", "keys": "batch-etl"}
    assert marks[screen] in svg


def joined_words(svg: str) -> list[str]:
    """Places where a styled run starts with a space right after a run ending in a letter or
    digit: read run by run (as the SVG's <text> elements are), the two words run together."""
    runs = re.findall(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg)
    lines: dict[float, list[tuple[float, str]]] = {}
    for x, y, text in runs:
        lines.setdefault(float(y), []).append((float(x), html.unescape(text)))
    found = []
    for parts in lines.values():
        parts.sort()
        for (_, before), (_, after) in zip(parts, parts[1:]):
            if before[-1:].isalnum() and after[:1] in (" ", "\xa0") and after.strip():
                found.append(f"{before.strip()[-20:]}|{after.strip()[:20]}")
    return found


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_no_styled_run_joins_two_words(size: tuple[int, int]):
    svg = (SNAPSHOTS / f"main_{size[0]}x{size[1]}.svg").read_text()
    assert joined_words(svg) == []
    pair = (
        '<text class="a" x="0" y="20">Instruct</text><text class="b" x="9" y="20">&#160;on</text>'
    )
    assert joined_words(pair) == ["Instruct|on"]  # what the 160x48 header was
