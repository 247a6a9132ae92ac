"""HelpScreen: the keys, over the dashboard; any key closes it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("q", "quit"),
    ("p", "pause / resume updates"),
    ("/", "filter requests by state (Enter keeps, Esc clears)"),
    ("s / S", "next sort column / reverse the order"),
    ("Enter", "open the selected request's trace"),
    ("Tab", "next panel"),
    ("c", "engine configuration and plan"),
    ("o", "show / hide the server log (serve --tui)"),
    ("Esc", "back"),
    ("?", "this help"),
)


class HelpScreen(ModalScreen[None]):
    def compose(self) -> ComposeResult:
        lines = [Text.assemble((f"{key:<7}", "bold"), what) for key, what in KEYS]
        with Vertical(id="help-box"):
            yield Static(Text("\n").join(lines))

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "Keys"

    def on_key(self) -> None:
        self.dismiss()
