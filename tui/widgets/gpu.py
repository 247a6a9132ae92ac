"""GpuPanel: the server's GPU readings (utilization, memory, power, temperature, SM clock);
`n/a` for each one the server could not read (a CPU engine, no NVML, no permission)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from tui import format as fmt
from tui.model import View
from tui.widgets.base import Panel


class GpuPanel(Panel):
    TITLE = "GPU"

    def compose(self) -> ComposeResult:
        yield Static(id="gpu-body")

    def show(self, view: View) -> None:
        self.query_one("#gpu-body", Static).update(render(view))


def render(view: View) -> Text:
    gpu = view.get("gpu")
    g = gpu if isinstance(gpu, dict) else {}
    used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
    memory = fmt.gib(used)
    if fmt.num(total) is not None:
        memory = f"{memory} / {fmt.gib(total)}"
    util = fmt.unit(g.get("utilization_perc"), "%")
    power = fmt.unit(g.get("power_w"), " W")
    lines = [
        Text(str(g.get("name") or "device: " + str(view.get("device") or fmt.NA)), "bold"),
        Text(f"util  {util:>6}   SM {fmt.unit(g.get('sm_clock_mhz'), ' MHz')}"),
        Text(f"mem   {memory}"),
        Text(f"power {power:>6}   temp {fmt.unit(g.get('temperature_c'), ' C')}"),
    ]
    if all(fmt.num(v) is None for k, v in g.items() if k != "name"):
        lines.append(Text("no GPU readings from the server", "dim"))
    return Text("\n").join(lines)
