"""PNG plots of a bench or tune run (matplotlib, Agg backend): latency and throughput vs load,
TTFT/TPOT histograms, KV usage and queue depth over time, and the tuner's search path."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from appliance.loadgen.client import RequestResult  # noqa: E402
from appliance.loadgen.load_shapes import StatsSample  # noqa: E402
from appliance.loadgen.report import SLO, LevelSummary  # noqa: E402


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _xlabel(summaries: list[LevelSummary]) -> str:
    return "request rate (req/s)" if summaries and summaries[0].mode == "open" else "concurrency"


def latency_vs_load(summaries: list[LevelSummary], slo: SLO, path: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    xs = [s.level for s in summaries]
    for ax, metric in zip(axes, ("ttft_s", "tpot_s", "e2e_s")):
        for pct in ("p50", "p95", "p99"):
            ys = [s.get(metric, pct) for s in summaries]
            pts = [(x, y * 1000) for x, y in zip(xs, ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=pct)
        limit = slo.limits().get(metric)
        if limit is not None:
            ax.axhline(limit * 1000, color="red", linestyle="--", label="SLO")
        ax.set_title(metric[:-2].upper())
        ax.set_xlabel(_xlabel(summaries))
        ax.set_ylabel("ms")
        ax.legend()
    return _save(fig, path)


def throughput_vs_load(summaries: list[LevelSummary], path: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    xs = [s.level for s in summaries]
    left.plot(xs, [s.output_token_throughput for s in summaries], marker="o", label="output")
    left.plot(xs, [s.input_token_throughput for s in summaries], marker="s", label="input")
    left.set_title("token throughput")
    left.set_ylabel("tokens/s")
    right.plot(xs, [s.request_throughput for s in summaries], marker="o", label="completed")
    right.plot(xs, [s.goodput for s in summaries], marker="s", label="goodput (met SLO)")
    right.set_title("request throughput")
    right.set_ylabel("requests/s")
    for ax in (left, right):
        ax.set_xlabel(_xlabel(summaries))
        ax.legend()
    return _save(fig, path)


def histograms(results: list[RequestResult], slo: SLO, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ok = [r for r in results if r.ok]
    for ax, metric in zip(axes, ("ttft_s", "tpot_s")):
        values = [v * 1000 for r in ok if (v := getattr(r, metric)) is not None]
        if values:
            ax.hist(values, bins=40)
        limit = slo.limits().get(metric)
        if limit is not None:
            ax.axvline(limit * 1000, color="red", linestyle="--", label="SLO")
            ax.legend()
        ax.set_title(f"{metric[:-2].upper()} ({len(values)} requests)")
        ax.set_xlabel("ms")
    return _save(fig, path)


def timeline(samples: list[StatsSample], path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ts = [s.t for s in samples]
    kv = [(s.t, s.kv_usage_perc) for s in samples if s.kv_usage_perc is not None]
    if kv:
        top.plot(*zip(*kv), label="KV usage %")
    mem = [(s.t, s.gpu_memory_used_bytes / 2**30) for s in samples if s.gpu_memory_used_bytes]
    if mem:
        twin = top.twinx()
        twin.plot(*zip(*mem), color="gray", label="GPU memory GiB")
        twin.set_ylabel("GiB")
    top.set_ylabel("KV usage %")
    top.set_title("KV cache" + ("" if mem else " (GPU memory: n/a)"))
    for name, attr in (("running", "num_running"), ("waiting", "num_waiting")):
        pts = [(s.t, getattr(s, attr)) for s in samples if getattr(s, attr) is not None]
        if pts:
            bottom.plot(*zip(*pts), label=name)
    bottom.set_ylabel("requests")
    bottom.set_xlabel("seconds")
    bottom.set_title("queue depth")
    if ts:
        bottom.legend()
    return _save(fig, path)


def search_path(points: list, slo: SLO, path: Path) -> Path:
    """The tuner's probes in order: p95 TTFT/TPOT per concurrency, passes green, fails red."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("ttft_s", "tpot_s")):
        for p in points:
            value = p.summary.get(metric, f"p{slo.percentile:g}")
            if value is not None:
                ax.scatter(p.concurrency, value * 1000, color="green" if p.ok else "red")
                ax.annotate(str(p.order), (p.concurrency, value * 1000), fontsize=7)
        limit = slo.limits().get(metric)
        if limit is not None:
            ax.axhline(limit * 1000, color="red", linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{metric[:-2].upper()} p{slo.percentile:g} per probe")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("ms")
    return _save(fig, path)


def bench_plots(
    summaries: list[LevelSummary],
    results: list[RequestResult],
    samples: list[StatsSample],
    slo: SLO,
    folder: Path,
) -> list[Path]:
    return [
        latency_vs_load(summaries, slo, folder / "latency_vs_load.png"),
        throughput_vs_load(summaries, folder / "throughput_vs_load.png"),
        histograms(results, slo, folder / "ttft_tpot_hist.png"),
        timeline(samples, folder / "kv_queue_timeline.png"),
    ]


def sweep_plot(rows: list, slo: SLO, path: Path) -> Path:
    """A tune sweep: p95 TPOT per probe for each point (left), and each point's capacity, the
    highest concurrency meeting the SLOs, with its output token rate (right)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    pct = f"p{slo.percentile:g}"
    metric = "tpot_s" if "tpot_s" in slo.limits() else next(iter(slo.limits()), "tpot_s")
    for row in rows:
        pts = sorted(
            (p.concurrency, v * 1000)
            for p in row.result.probes
            if (v := p.summary.get(metric, pct)) is not None
        )
        if pts:
            left.plot(*zip(*pts), marker="o", label=row.label)
    limit = slo.limits().get(metric)
    if limit is not None:
        left.axhline(limit * 1000, color="red", linestyle="--", label="SLO")
    left.set_xscale("log", base=2)
    left.set_title(f"{metric[:-2].upper()} {pct} per probe")
    left.set_xlabel("concurrency")
    left.set_ylabel("ms")
    left.legend(fontsize=7)
    labels = [row.label.replace(" ", "\n") for row in rows]
    best = [row.result.best or 0 for row in rows]
    bars = right.bar(range(len(rows)), best, color="tab:blue")
    for bar, row in zip(bars, rows):
        probe = row.result.best_probe
        text = f"{probe.summary.output_token_throughput:.0f} tok/s" if probe else "none"
        right.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    right.set_xticks(range(len(rows)), labels, fontsize=7)
    right.set_title("capacity per point (highest concurrency meeting the SLOs)")
    right.set_ylabel("concurrency")
    return _save(fig, path)
