"""KVPanel: KV-cache blocks used of total as a gauge, their history, a hybrid model's state
slots in use, the prefix cache's hit rate over the last minute (with its history) and the
blocks it holds, how much of the used cache the largest requests hold, and the preemptions so
far."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
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
        with Horizontal(classes="spark-row"):
            yield Label(id="kv-hit", classes="spark-label")
            yield Sparkline([], id="kv-hit-spark")
            yield Label(id="kv-cached")
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
            f"{fmt.integer(used)}/{fmt.integer(total)} blocks{state_cell(view)} · "
            f"preempted {fmt.integer(preempted)}"
        )
        self.query_one("#kv-spark", Sparkline).data = list(view.kv_perc)
        hit, cached = hit_cells(view)
        self.query_one("#kv-hit", Label).update(hit)
        self.query_one("#kv-hit-spark", Sparkline).data = list(view.hit_perc)
        self.query_one("#kv-cached", Label).update(cached)
        share, holders = top_lines(view)
        self.query_one("#kv-top", Label).update(share)
        self.query_one("#kv-top-ids", Label).update(holders)


def state_cell(view: View) -> str:
    """` · state 3/64 slots`: a hybrid model's linear-attention state slots in use of the pool's
    (the engine's state_slots_used / state_slots_total, one slot per running sequence); empty
    for a model that keeps no state (the engine leaves them out or None)."""
    total = fmt.num(view.get("engine", "state_slots_total"))
    if not total:
        return ""
    used = fmt.integer(view.get("engine", "state_slots_used"))
    return f" · state {used}/{fmt.integer(total)} slots"


def hit_cells(view: View) -> tuple[str, str]:
    """(`hit   42%`, ` 96 cached`): the prefix cache's hit rate over the server's last minute
    (n/a while it looked nothing up, or when the server does not say) and the blocks holding
    cached prefixes; `off` when the engine caches no prefixes."""
    cache = view.get("kv", "prefix_cache")
    enabled = cache.get("enabled") if isinstance(cache, dict) else None
    if enabled is False:
        return f"hit {'off':>5}", ""
    if enabled is None:
        return f"hit {fmt.NA:>5}", ""
    rate = fmt.unit(cache.get("hit_rate_perc"), "%")
    return f"hit {rate:>5}", f" {fmt.integer(view.get('kv', 'blocks_cached'))} cached"


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
