"""Gauge: a one-line bar with a percentage, drawn with block characters so that it reads the
same without colour; it fills whatever width the layout gives it."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tui import format as fmt


class Gauge(Widget):
    DEFAULT_CSS = "Gauge { height: 1; }"

    fraction: reactive[float | None] = reactive(None)
    """0..1, or None when unknown (drawn as n/a)."""

    def render(self) -> Text:
        label = fmt.NA if self.fraction is None else f"{100 * self.fraction:5.1f}%"
        width = max(1, self.content_size.width - len(label) - 1)
        bar = fmt.gauge(self.fraction or 0.0, width)
        return Text.assemble((bar, "bold"), " ", label)
