"""The soak's report: soak.json (settings, every interval's figures, the request ledger, the
verdict) and PNG plots of every recorded series over time (matplotlib, Agg backend)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from appliance.soak.rules import ENDINGS, Ledger  # noqa: E402

PANELS = (
    ("memory.png", "memory (MiB)", (("rss_bytes", "RSS"), ("gpu_memory_bytes", "GPU")), 2**20),
    (
        "latency.png",
        "latency (ms)",
        (
            ("ttft_p50", "TTFT p50"),
            ("ttft_p99", "TTFT p99"),
            ("tpot_p50", "TPOT p50"),
            ("tpot_p99", "TPOT p99"),
        ),
        1e-3,
    ),
    (
        "idle.png",
        "held at idle",
        (("kv_blocks_idle", "KV blocks"), ("inflight_idle", "requests")),
        1,
    ),
)
"""One PNG per group: file name, y label, (series key, legend) pairs, the unit it divides by."""


def write_report(out: Path, settings: dict, rows: list[dict], ledger: Ledger, reasons: list[str]):
    """soak.json and the plots in `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "settings": settings,
        "intervals": rows,
        "requests": ledger.to_json(),
        "passed": not reasons,
        "reasons": reasons,
    }
    path = out / "soak.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return [path, *write_plots(out, rows)]


def write_plots(out: Path, rows: list[dict]) -> list[Path]:
    """A PNG per group of series against the interval's end time (a series the server did not
    report is left out), and one of the requests' endings per interval."""
    t = [r["t_end"] for r in rows]
    paths = []
    for name, ylabel, series, unit in PANELS:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for key, label in series:
            values = [r.get(key) for r in rows]
            if any(v is not None for v in values):
                ax.plot(t, [None if v is None else v / unit for v in values], "o-", label=label)
        _finish(fig, ax, ylabel, out / name)
        paths.append(out / name)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for ending in ENDINGS:
        counts = [(r.get("endings") or {}).get(ending, 0) for r in rows]
        if any(counts):
            ax.plot(t, counts, "o-", label=ending)
    _finish(fig, ax, "requests per interval", out / "endings.png")
    paths.append(out / "endings.png")
    return paths


def _finish(fig, ax, ylabel: str, path: Path) -> None:
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
