"""Timeline: a request's trace drawn as one bar per choice over time: queued, prefill, decode,
with preemptions marked; plain block characters, so it reads the same without colour."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tui import format as fmt

GLYPHS = {"queued": "░", "prefill": "▒", "decode": "█", "done": " "}
PREEMPT = "X"
LEGEND = "░ queued  ▒ prefill  █ decode  X preempted  | first token"
NEXT_PHASE = {
    "scheduled": "prefill",
    "prefill_chunk": "prefill",
    "first_token": "decode",
    "preempted": "queued",
    "finished": "done",
}


def phases(events: list[dict]) -> list[tuple[float, str]]:
    """(start ms, phase) changes of one choice, from its engine events in time order."""
    out: list[tuple[float, str]] = [(0.0, "queued")]
    for e in events:
        phase = NEXT_PHASE.get(str(e.get("event")))
        if phase is not None and phase != out[-1][1]:
            out.append((float(e.get("t_ms") or 0.0), phase))
    return out


def bar(events: list[dict], span_ms: float, width: int) -> str:
    """One choice's bar, `width` cells for `span_ms` milliseconds."""
    changes = phases(events)
    cells = []
    for col in range(width):
        t = (col + 0.5) * span_ms / width
        phase = "queued"
        for start, name in changes:
            if start <= t:
                phase = name
        cells.append(GLYPHS[phase])
    for e in events:
        col = min(width - 1, int(float(e.get("t_ms") or 0.0) / span_ms * width)) if span_ms else 0
        if e.get("event") == "preempted":
            cells[col] = PREEMPT
        elif e.get("event") == "first_token" and cells[col] != PREEMPT:
            cells[col] = "|"
    return "".join(cells)


class Timeline(Widget):
    """Bars for every choice of the trace bound to `trace`, with a time axis and a legend."""

    DEFAULT_CSS = "Timeline { height: auto; }"

    trace: reactive[dict | None] = reactive(None, layout=True)

    def render(self) -> Text:
        trace = self.trace
        if not trace:
            return Text("loading the trace…")
        events = [e for e in trace.get("events") or [] if isinstance(e, dict)]
        span = max([float(e.get("t_ms") or 0.0) for e in events] + [0.0])
        choices = sorted({e["choice"] for e in events if e.get("source") == "engine"})
        label_w = 10
        width = max(10, self.content_size.width - label_w)
        lines = []
        for index in choices or [0]:
            mine = [e for e in events if e.get("source") == "engine" and e.get("choice") == index]
            text = bar(mine, span, width) if mine else "(no engine events yet)".ljust(width)
            lines.append(Text(f"choice {index:<3}", "bold") + Text(text))
        end = f"{fmt.seconds(span / 1000)}"
        lines.append(Text(" " * label_w + "0".ljust(width - len(end)) + end, "dim"))
        lines.append(Text(LEGEND, "dim"))
        return Text("\n").join(lines)
