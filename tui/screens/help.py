"""HelpScreen: the keys and the request table's `out` marks, over the dashboard; any key
closes it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tui import model

KEYS = (
    ("q", "quit"),
    ("p", "pause / resume updates"),
    ("/", "filter requests by state, id or out mark; keys by name or class"),
    ("s / S", "next sort column / reverse the order"),
    ("Enter", "open the selected request's trace"),
    ("k", "per-key table: in place of the requests (small screens), or hide it"),
    ("Tab", "next panel"),
    ("c", "engine configuration and plan"),
    ("m / M", "next / previous model, or Enter or a click on its row (several models)"),
    ("o", "show / hide the server log (serve --tui)"),
    ("Esc", "back"),
    ("?", "this help"),
)

OUT_MARKS = [f"{mark} {kind}" for kind, mark in model.OUT_MARKS.items()]
OUT_MARKS.append(f"{model.TOOLS_MARK} tools sent")
MARKS_PER_LINE = 4


class HelpScreen(ModalScreen[None]):
    def compose(self) -> ComposeResult:
        lines = [Text.assemble((f"{key:<7}", "bold"), what) for key, what in KEYS]
        lines.append(Text(""))
        for i in range(0, len(OUT_MARKS), MARKS_PER_LINE):
            head = "out" if i == 0 else ""
            marks = " · ".join(OUT_MARKS[i : i + MARKS_PER_LINE])
            lines.append(Text.assemble((f"{head:<7}", "bold"), marks))
        with Vertical(id="help-box"):
            yield Static(Text("\n").join(lines))

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "Keys"

    def on_key(self) -> None:
        self.dismiss()
