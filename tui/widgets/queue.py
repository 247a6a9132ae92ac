"""QueuePanel: requests waiting and running (with their history), requests refused with 429,
timed out, and in flight against the server's capacity."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Sparkline

from tui import format as fmt
from tui.model import View
from tui.widgets.base import Panel


class QueuePanel(Panel):
    TITLE = "Queue"

    def compose(self) -> ComposeResult:
        with Horizontal(classes="spark-row"):
            yield Label(id="q-waiting", classes="spark-label")
            yield Sparkline([], id="q-waiting-spark")
        with Horizontal(classes="spark-row"):
            yield Label(id="q-running", classes="spark-label")
            yield Sparkline([], id="q-running-spark")
        yield Label(id="q-refused")
        yield Label(id="q-inflight")

    def show(self, view: View) -> None:
        waiting = view.get("engine", "num_waiting")
        running = view.get("engine", "num_running")
        self.query_one("#q-waiting", Label).update(f"waiting {fmt.integer(waiting):>4}")
        self.query_one("#q-running", Label).update(f"running {fmt.integer(running):>4}")
        self.query_one("#q-waiting-spark", Sparkline).data = list(view.waiting)
        self.query_one("#q-running-spark", Sparkline).data = list(view.running)
        rejected = view.get("queue", "rejected_total")
        if rejected is None:
            rejected = view.get("counters", "rejected_total")
        timed_out = view.get("queue", "timed_out_total")
        self.query_one("#q-refused", Label).update(
            f"rejected (429) {fmt.integer(rejected)} · timed out {fmt.integer(timed_out)}"
        )
        max_seqs = view.get("config", "max_num_seqs")
        max_queue = view.get("server", "max_queue")
        self.query_one("#q-inflight", Label).update(
            f"in flight {fmt.integer(view.get('requests_in_flight'))}"
            f" · cap {fmt.integer(max_seqs)}+{fmt.integer(max_queue)}"
        )
