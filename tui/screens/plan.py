"""PlanScreen: the memory plan the server reports in /v1/stats (each chosen setting with the
planner's one-line reason, the byte budget), the memory check after warm-up (predicted vs
measured per item), and the engine configuration. `n/a` for what the server does not report."""

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
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_kv_blocks",
    "gpu_memory_utilization",
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "enforce_eager",
    "seed",
)
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


GIB = 1024**3
BUDGET_ITEMS = (
    ("budget", "budget_bytes"),
    ("weights", "weight_bytes"),
    ("activation", "activation_bytes"),
    ("CUDA graph pool", "graph_pool_bytes"),
    ("allocator cache", "allocator_bytes"),
    ("CUDA context", "cuda_context_bytes"),
    ("safety margin", "margin_bytes"),
    ("KV pool", "kv_pool_bytes"),
    ("state pool", "state_pool_bytes"),
)
OPTIONAL_ITEMS = ("state_pool_bytes", "state_pool")
"""Items shown only where non-zero: a hybrid model's state pool (plan key, memory-check key)."""


def gib(n: object) -> str:
    return f"{n / GIB:.2f} GiB" if isinstance(n, int | float) else fmt.NA


def plan_table(plan: dict) -> Table:
    """Each chosen setting, its value and the planner's reason."""
    t = Table(title="Memory plan", title_justify="left", box=None, padding=(0, 1))
    for name in ("setting", "value", "why"):
        t.add_column(name, style="bold" if name == "setting" else None, no_wrap=name != "why")
    for key, why in (plan.get("reasons") or {}).items():
        t.add_row(key, value_text(plan.get(key)), str(why))
    for label, key in BUDGET_ITEMS:
        if key in plan and (plan[key] or key not in OPTIONAL_ITEMS):
            t.add_row(label, gib(plan[key]), "")
    return t


def check_table(check: dict) -> Table:
    """Predicted vs measured memory per item after warm-up."""
    t = Table(title="Memory check after warm-up", title_justify="left", box=None, padding=(0, 1))
    t.add_column("item", style="bold")
    for name in ("predicted", "measured", "diff"):
        t.add_column(name, justify="right")
    predicted, measured = check.get("predicted") or {}, check.get("measured") or {}
    rows = [
        (k, predicted.get(k), measured.get(k))
        for k in measured
        if k not in OPTIONAL_ITEMS or predicted.get(k) or measured.get(k)
    ]
    total = sum(predicted.values()) if predicted else None
    rows.append(("peak", total, check.get("measured_peak")))
    for item, pred, meas in rows:
        diff = (
            f"{100 * (meas - pred) / pred:+.1f}%"
            if isinstance(pred, int | float) and isinstance(meas, int | float) and pred
            else fmt.NA
        )
        t.add_row(item, gib(pred), gib(meas), diff)
    return t


def check_outcome(check: dict) -> Text:
    shed = check.get("shed_blocks") or 0
    if shed:
        return Text(
            f"the peak ran over the plan: KV pool shrunk by {shed} blocks to "
            f"{check.get('final_blocks')} before serving"
        )
    return Text("the measured peak is within the plan")


def render(view: View | None) -> Group:
    doc = view.doc if view else {}
    config = doc.get("config") or {}
    plan = doc.get("plan")
    fields = {k: config.get(k) for k in CONFIG_FIELDS}
    fields.update({k: v for k, v in config.items() if k not in fields})
    kv_total = (doc.get("engine") or {}).get("kv_blocks_total")
    fields["kv_blocks_total (live)"] = kv_total
    parts: list = []
    if isinstance(plan, dict) and plan.get("reasons"):
        parts.append(plan_table(plan))
        check = plan.get("memory_check")
        if isinstance(check, dict):
            parts += [Text(""), check_table(check), check_outcome(check)]
    elif isinstance(plan, dict) and plan:
        parts.append(table("Memory plan", plan))
    else:
        parts.append(Text("Memory plan: n/a (this server reports no plan)", "bold"))
    return Group(*parts, Text(""), table("Engine configuration", fields))


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
