"""GpuPanel: the server's GPU readings (utilization, memory, power, temperature, SM clock),
`n/a` for each one the server could not read (a CPU engine, no NVML, no permission), and the
memory bandwidth decode achieves as a share of the device's peak (engine stats' "bandwidth")."""

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
        bandwidth_line(view),
    ]
    if all(fmt.num(v) is None for k, v in g.items() if k != "name"):
        lines.append(Text("no GPU readings from the server", "dim"))
    return Text("\n").join(lines)


def bandwidth_line(view: View) -> Text:
    """ "bw    3.94 TB/s  82% of nominal": bytes decode steps read over their time, in the
    engine's last few seconds of decode, as a share of the peak the plan names (nominal: the
    GPU class profile's figure). While nothing runs the figure is the last decode's."""
    bw = view.get("engine", "bandwidth")
    b = bw if isinstance(bw, dict) else {}
    achieved = fmt.num(b.get("achieved_gbs"))
    if achieved is None:
        return Text(f"bw    {fmt.NA}")
    kind = "nominal" if str(b.get("peak_source") or "").startswith("nominal") else "peak"
    share = fmt.unit(b.get("share_perc"), "%")
    # Styled runs end with their space: a run that starts with one reads as joined to the
    # previous word where each run is taken apart (the SVG snapshots' <text> elements).
    text = Text.assemble("bw    ", (f"{fmt.bandwidth(achieved)} {share:>4} ", "bold"))
    text.append(f"of {kind}")
    if view.get("engine", "num_running") == 0:
        text.append(" · idle")
    return text
