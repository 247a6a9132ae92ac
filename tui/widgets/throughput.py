"""ThroughputPanel: prompt and generated tokens per second, and TTFT, TPOT and end-to-end
latency percentiles over the server's recent window."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from tui import format as fmt
from tui.model import View
from tui.widgets.base import Panel

LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))


class ThroughputPanel(Panel):
    TITLE = "Throughput"

    def compose(self) -> ComposeResult:
        yield Static(id="tp-body")

    def show(self, view: View) -> None:
        self.query_one("#tp-body", Static).update(render(view))


def render(view: View) -> Text:
    prompt = view.get("throughput", "prompt_tokens_per_s")
    gen = view.get("throughput", "generation_tokens_per_s")
    lines = [
        # Bold runs end with the spaces after them (see tui.widgets.header).
        Text.assemble(
            "tok/s prompt ", (fmt.rate(prompt) + "  ", "bold"), "gen ", (fmt.rate(gen), "bold")
        ),
        Text(f"{'':5}{'p50':>8}{'p95':>8}{'p99':>8}", "dim"),
    ]
    for label, key in LATENCIES:
        cells = [f"{fmt.seconds(view.get('latency', key, q)):>8}" for q in ("p50", "p95", "p99")]
        lines.append(Text(f"{label:<5}" + "".join(cells)))
    return Text("\n").join(lines)
