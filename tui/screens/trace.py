"""TraceScreen: one request's life: a summary line (with the prompt tokens the prefix cache held,
and, for a structured or tool request, its grammar: compile time and mask time per step; with
speculative decoding, the tokens drafted and accepted), a
timeline per choice (queued -> prefill chunks -> first token -> decode -> finish, preemptions
marked) and the full event list."""

from __future__ import annotations

import json

import aiohttp
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tui import format as fmt
from tui.model import FINAL_STATES, display_state, finish_text
from tui.source import SourceError, StatsSource
from tui.widgets.timeline import Timeline

REFRESH_S = 1.0
"""How often the trace of an unfinished request is fetched again."""


class TraceScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("r", "reload", "Reload")]

    trace: reactive[dict | None] = reactive(None, always_update=True)
    error: reactive[str | None] = reactive(None)

    def __init__(self, source: StatsSource, request_id: str) -> None:
        super().__init__(id="trace")
        self.source, self.request_id = source, request_id

    def compose(self) -> ComposeResult:
        yield Static(Text(f"Trace of request {self.request_id}", "bold"), id="trace-title")
        yield Static("", id="trace-summary")
        yield Timeline(id="timeline")
        events: DataTable = DataTable(cursor_type="row", id="trace-events")
        events.add_columns("t (ms)", "source", "choice", "event", "detail")
        yield events
        yield Footer()

    def on_mount(self) -> None:
        self.action_reload()
        self.set_interval(REFRESH_S, self._refresh_unfinished)

    def _refresh_unfinished(self) -> None:
        if self.trace is not None and self.trace.get("state") not in FINAL_STATES:
            self.action_reload()

    def action_reload(self) -> None:
        self._fetch()

    @work(exclusive=True, group="trace")
    async def _fetch(self) -> None:
        try:
            self.trace = await self.source.trace(self.request_id)
            self.error = None
        except (SourceError, aiohttp.ClientError, TimeoutError) as exc:
            self.error = str(exc) or type(exc).__name__

    def watch_error(self, error: str | None) -> None:
        if error:
            self.query_one("#trace-summary", Static).update(
                Text(f"cannot load the trace: {error}", "bold reverse")
            )

    def watch_trace(self, trace: dict | None) -> None:
        if trace is None:
            return
        self.query_one("#trace-summary", Static).update(summary(trace))
        self.query_one(Timeline).trace = trace
        table = self.query_one("#trace-events", DataTable)
        table.clear()
        for e in trace.get("events") or []:
            detail = e.get("detail")
            table.add_row(
                f"{fmt.num(e.get('t_ms')) or 0.0:10.3f}",
                str(e.get("source", "")),
                "" if e.get("choice") is None else str(e["choice"]),
                str(e.get("event", "")),
                json.dumps(detail, separators=(",", ":")) if detail else "",
            )


def summary(trace: dict) -> Text:
    state = display_state(trace)
    finish = finish_text(trace)
    parts = [
        f"{state}{f' ({finish})' if finish else ''}",
        f"{trace.get('endpoint', '?')}",
        f"prompt {fmt.integer(trace.get('prompt_tokens'))}",
        f"cached {fmt.integer(trace.get('cached_tokens'))}",
        f"gen {fmt.integer(trace.get('completion_tokens'))}",
        f"queue {fmt.seconds(trace.get('queue_s'))}",
        f"TTFT {fmt.seconds(trace.get('ttft_s'))}",
        f"TPOT {fmt.seconds(trace.get('tpot_s'))}",
        f"E2E {fmt.seconds(trace.get('e2e_s'))}",
        f"preemptions {fmt.integer(trace.get('num_preemptions'))}",
    ]
    text = Text(" · ".join(parts))
    grammar = grammar_line(trace)
    if grammar:
        text.append(f"\n{grammar}")
    spec = spec_line(trace)
    if spec:
        text.append(f"\n{spec}")
    if trace.get("error"):
        text.append(f"\nerror: {trace['error']}", "bold")
    return text


def grammar_line(trace: dict) -> str | None:
    """What held the output: the grammar kind, whether tools were sent, the front end's compile
    check and, over the choices the engine finished, its compile and mask time per step; None
    for an unconstrained request without tools."""
    kind, tools = trace.get("structured"), trace.get("tools") is True
    if not kind and not tools:
        return None
    parts = [f"grammar {kind}" if kind else "no grammar"]
    if tools:
        parts.append("tools sent")
    check = fmt.num(trace.get("grammar_compile_s"))
    if check is not None:
        parts.append(f"compile check {fmt.seconds(check)}")
    done = [
        c["grammar"]
        for c in trace.get("choices") or []
        if isinstance(c, dict) and isinstance(c.get("grammar"), dict)
    ]
    steps = sum(int(fmt.num(g.get("mask_steps")) or 0) for g in done)
    if done:
        compile_ms = max(fmt.num(g.get("compile_ms")) or 0.0 for g in done)
        parts.append(f"engine compile {fmt.seconds(compile_ms / 1e3)}")
    if steps:
        total_ms = sum(
            (fmt.num(g.get("mask_ms_mean")) or 0.0) * (fmt.num(g.get("mask_steps")) or 0)
            for g in done
        )
        max_ms = max(fmt.num(g.get("mask_ms_max")) or 0.0 for g in done)
        parts.append(
            f"mask {fmt.seconds(total_ms / steps / 1e3)}/step "
            f"(max {fmt.seconds(max_ms / 1e3)}, {steps} steps)"
        )
    return " · ".join(parts)


def spec_line(trace: dict) -> str | None:
    """`speculative: drafted 120 · accepted 74 (62%)`, summed over the engine's "spec" events
    (one per choice that drafted, at its end); None for a request that drafted nothing."""
    events = [
        e["detail"]
        for e in trace.get("events") or []
        if e.get("event") == "spec" and isinstance(e.get("detail"), dict)
    ]
    if not events:
        return None
    drafted = sum(int(fmt.num(d.get("drafted")) or 0) for d in events)
    accepted = sum(int(fmt.num(d.get("accepted")) or 0) for d in events)
    share = f" ({fmt.unit(100 * accepted / drafted, '%')})" if drafted else ""
    return f"speculative: drafted {drafted} · accepted {accepted}{share}"
