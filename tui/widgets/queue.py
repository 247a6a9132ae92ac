"""QueuePanel: requests waiting and running (with their history), requests refused with 429,
timed out, in flight against the server's capacity, and speculative decoding's k and
acceptance (the panel's one free line in every layout)."""

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
        yield Label(id="q-spec")

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
        self.query_one("#q-spec", Label).update(spec_cell(view))


def spec_cell(view: View) -> str:
    """`spec k=4 · accept 62% · 2.50/draft`: the engine's last chosen k (spec_decode.k; else the
    configured num_speculative_tokens, `auto` when unset), the share of drafted tokens the
    target accepted and the accepted tokens per draft (n/a before the first draft); `spec off`
    when the config says off or the engine reports no spec_decode section (a model it turns
    speculation off for); "" when the server's config does not say."""
    mode = view.get("config", "speculative")
    if mode is None:
        return ""
    spec = view.get("engine", "spec_decode")
    if mode == "off" or not isinstance(spec, dict):
        return "spec off"
    k = spec.get("k", view.get("config", "num_speculative_tokens"))
    rate, mean = fmt.num(spec.get("acceptance_rate")), fmt.num(spec.get("mean_accepted_length"))
    accept = fmt.unit(None if rate is None else 100 * rate, "%")
    return (
        f"spec k={fmt.integer(k) if k is not None else 'auto'} · accept {accept} · "
        f"{fmt.NA if mean is None else f'{mean:.2f}'}/draft"
    )
