"""PlanScreen: the engine configuration and the memory plan the server reports in /v1/stats
(`n/a` for what it does not report: the planner's own table arrives with [4 of 7])."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Static

from tui import format as fmt
from tui.model import View

CONFIG_FIELDS = (
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks",
    "gpu_memory_utilization", "dtype", "kv_cache_dtype", "quantization", "enforce_eager", "seed",
)  # fmt: skip
"""The engine settings every appliance reports, shown even when a value is missing."""


def value_text(value: object) -> str:
    if value is None:
        return fmt.NA
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return (
            ", ".join(f"{k}={v}" for k, v in value.items())
            if isinstance(value, dict)
            else str(value)
        )
    return str(value)


def table(title: str, items: dict) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 1))
    t.add_column("setting", style="bold", no_wrap=True)
    t.add_column("value")
    for key, value in items.items():
        t.add_row(key, value_text(value))
    return t


def render(view: View | None) -> Group:
    doc = view.doc if view else {}
    config = doc.get("config") or {}
    plan = doc.get("plan")
    fields = {k: config.get(k) for k in CONFIG_FIELDS}
    fields.update({k: v for k, v in config.items() if k not in fields})
    kv_total = (doc.get("engine") or {}).get("kv_blocks_total")
    fields["kv_blocks_total (live)"] = kv_total
    if isinstance(plan, dict) and plan:
        head = table("Memory plan", plan)
    else:
        head = Text("Memory plan: n/a (this server reports no plan)", "bold")
    return Group(head, Text(""), table("Engine configuration", fields))


class PlanScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    view: reactive[View | None] = reactive(None, always_update=True)

    def __init__(self) -> None:
        super().__init__(id="plan")

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="plan-body")
        yield Footer()

    def watch_view(self, view: View | None) -> None:
        if self.is_mounted:
            self.query_one("#plan-body", Static).update(render(view))

    def on_mount(self) -> None:
        self.query_one("#plan-body", Static).update(render(self.view))
