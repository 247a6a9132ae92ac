"""KVPanel: KV-cache blocks used of total as a gauge, their history, how much of the used
cache the largest requests hold, and the preemptions so far."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Label, Sparkline

from tui import format as fmt
from tui.model import View
from tui.widgets.base import Panel
from tui.widgets.gauge import Gauge


class KVPanel(Panel):
    TITLE = "KV cache"

    def compose(self) -> ComposeResult:
        yield Gauge(id="kv-gauge")
        yield Label(id="kv-blocks")
        yield Sparkline([], id="kv-spark")
        yield Label(id="kv-top")
        yield Label(id="kv-top-ids")

    def show(self, view: View) -> None:
        used, total = (
            fmt.num(view.get("engine", "kv_blocks_used")),
            view.get("engine", "kv_blocks_total"),
        )
        total_n = fmt.num(total)
        self.query_one(Gauge).fraction = used / total_n if used is not None and total_n else None
        preempted = view.get("kv", "num_preemptions_total")
        if preempted is None:
            preempted = view.get("engine", "num_preemptions_total")
        self.query_one("#kv-blocks", Label).update(
            f"{fmt.integer(used)}/{fmt.integer(total)} blocks · preempted {fmt.integer(preempted)}"
        )
        self.query_one(Sparkline).data = list(view.kv_perc)
        share, holders = top_lines(view)
        self.query_one("#kv-top", Label).update(share)
        self.query_one("#kv-top-ids", Label).update(holders)


def top_lines(view: View) -> tuple[str, str]:
    """(`largest 3 hold 61% of used`, `1f3a2b 30% · …`), or n/a when the server cannot say."""
    share = view.get("kv", "top_share_perc")
    top = view.get("kv", "top_requests")
    if fmt.num(share) is None or not isinstance(top, list):
        return f"largest requests: {fmt.NA}", ""
    if not top:
        return "largest requests: none running", ""
    holders = [
        f"{fmt.short_id(str(t.get('id', '?')), 8)} {fmt.unit(t.get('share_perc'), '%')}"
        for t in top
    ]
    return f"largest {len(top)} hold {fmt.unit(share, '%')} of used", " ".join(holders)
