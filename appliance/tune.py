"""SLA auto-tuning: find the highest concurrency that meets the latency SLOs (double, then
binary-search), hold it for a soak window checking for drift, and build the tuned profile."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from appliance.loadgen.client import RequestResult
from appliance.loadgen.load_shapes import StatsSample
from appliance.loadgen.profile import TunedProfile, load_tuned_profile, write_tuned_profile
from appliance.loadgen.report import SLO, LevelSummary, percentile
from appliance.tune_probe import MAX_ERROR_FRAC, MAX_REPEATS, Measured, binding

__all__ = [
    "MAX_ERROR_FRAC",
    "Drift",
    "Measured",
    "Probe",
    "SearchResult",
    "TunedProfile",
    "build_profile",
    "check_slo",
    "detect_drift",
    "load_tuned_profile",
    "search",
    "write_tuned_profile",
]

DRIFT_RATIO = 1.25
"""Soak latency in the last third above this multiple of the first third is drift."""
MEMORY_DRIFT_FRAC = 0.02


@dataclass
class Probe:
    """One measured concurrency of the search."""

    order: int
    concurrency: int
    ok: bool
    reasons: list[str]
    summary: LevelSummary
    discarded: list[str] = field(default_factory=list)
    """Why each earlier try at this concurrency was measured again."""
    disturbances: list[str] = field(default_factory=list)
    """What disturbed this try, believed only because the repeats ran out."""

    @property
    def attempts(self) -> int:
        return 1 + len(self.discarded)


@dataclass
class SearchResult:
    best: int | None
    """The highest concurrency that met the SLOs (None: not even the lowest tried)."""
    first_bad: int | None
    """The lowest concurrency that broke them (None: none did up to the maximum)."""
    probes: list[Probe] = field(default_factory=list)

    @property
    def best_probe(self) -> Probe | None:
        return next((p for p in self.probes if p.concurrency == self.best and p.ok), None)


def check_slo(summary: LevelSummary, slo: SLO) -> list[str]:
    """Why a level breaks the SLOs (empty: it meets them) at the SLO's percentile."""
    reasons = []
    if summary.num_ok == 0:
        return ["no request succeeded"]
    failed = summary.num_requests - summary.num_ok
    if failed > MAX_ERROR_FRAC * summary.num_requests:
        reasons.append(f"{failed}/{summary.num_requests} requests failed {summary.errors}")
    pct = f"p{slo.percentile:g}"
    for metric, limit in slo.limits().items():
        value = summary.get(metric, pct)
        if value is not None and value > limit:
            reasons.append(f"{pct} {metric[:-2]} {value * 1000:.1f}ms > {limit * 1000:g}ms")
    return reasons


async def search(
    measure: Callable[[int], Awaitable[LevelSummary | Measured]],
    slo: SLO,
    start: int = 4,
    max_concurrency: int = 256,
    on_probe: Callable[[Probe], None] | None = None,
    resolution: float = 0.0,
) -> SearchResult:
    """Double from `start` until the SLOs break (or `max_concurrency`), then binary-search
    between the last good and the first bad value, until they are 1 apart or, with
    `resolution` > 0, within that share of the good value (0.1: stop within 10%). A failing
    start searches below it. A try that `measure` reports disturbed (Measured.disturbances:
    compiles, a stall) is measured again, up to MAX_REPEATS times, and the last try believed."""
    if start < 1 or max_concurrency < start:
        raise ValueError("need 1 <= start <= max_concurrency")
    probes: list[Probe] = []
    tried: dict[int, bool] = {}

    async def probe(c: int) -> bool:
        discarded: list[str] = []
        while True:
            got = await measure(c)
            latest = got if isinstance(got, Measured) else Measured(got)
            if not latest.disturbances or len(discarded) >= MAX_REPEATS:
                break
            discarded.append("; ".join(latest.disturbances))
        summary = latest.summary
        reasons = check_slo(summary, slo)
        p = Probe(len(probes) + 1, c, not reasons, reasons, summary, discarded, latest.disturbances)
        probes.append(p)
        tried[c] = p.ok
        if on_probe is not None:
            on_probe(p)
        return p.ok

    good, bad = 0, None
    c = start
    while bad is None:
        if await probe(c):
            good = c
            if c >= max_concurrency:
                break
            c = min(2 * c, max_concurrency)
        else:
            bad = c
    while bad is not None and bad - good > max(1, int(resolution * good)):
        mid = (good + bad) // 2
        if await probe(mid):
            good = mid
        else:
            bad = mid
    return SearchResult(best=good or None, first_bad=bad, probes=probes)


@dataclass
class Drift:
    """What a soak showed: latency and memory in its first vs last third."""

    ratios: dict[str, float | None]
    """metric -> p95 in the last third / p95 in the first third."""
    memory_growth_bytes: int | None
    kv_usage_change_perc: float | None
    notes: list[str]

    @property
    def stable(self) -> bool:
        return not self.notes


def _thirds(items: list, key: Callable) -> tuple[list, list]:
    if not items:
        return [], []
    lo, hi = min(map(key, items)), max(map(key, items))
    span = (hi - lo) / 3
    return [x for x in items if key(x) <= lo + span], [x for x in items if key(x) >= hi - span]


def detect_drift(results: list[RequestResult], samples: list[StatsSample]) -> Drift:
    """Compare the first and last third of a soak: latency creeping up, memory growing."""
    notes = []
    ok = [r for r in results if r.ok]
    first, last = _thirds(ok, lambda r: r.start)
    ratios: dict[str, float | None] = {}
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        a = percentile([v for r in first if (v := getattr(r, metric)) is not None], 95)
        b = percentile([v for r in last if (v := getattr(r, metric)) is not None], 95)
        ratios[metric] = b / a if a and b is not None else None
        if ratios[metric] is not None and ratios[metric] > DRIFT_RATIO:
            notes.append(f"p95 {metric[:-2]} grew {ratios[metric]:.2f}x over the soak")
    errors_first = sum(not r.ok for r in _thirds(results, lambda r: r.start)[0])
    errors_last = sum(not r.ok for r in _thirds(results, lambda r: r.start)[1])
    if errors_last > max(2, 2 * errors_first):
        notes.append(f"errors rose from {errors_first} to {errors_last} per third")

    def growth(attr: str) -> float | None:
        pts = [s for s in samples if getattr(s, attr) is not None]
        a, b = _thirds(pts, lambda s: s.t)
        if not a or not b:
            return None
        return sum(getattr(s, attr) for s in b) / len(b) - sum(getattr(s, attr) for s in a) / len(a)

    mem = growth("gpu_memory_used_bytes")
    base = next((s.gpu_memory_used_bytes for s in samples if s.gpu_memory_used_bytes), None)
    if mem is not None and base and mem > MEMORY_DRIFT_FRAC * base:
        notes.append(f"GPU memory grew {mem / 2**20:.0f} MiB over the soak")
    kv = growth("kv_usage_perc")
    return Drift(ratios, None if mem is None else int(mem), kv, notes)


def build_profile(
    name: str,
    info,
    result: SearchResult,
    soak: LevelSummary | None,
    drift: Drift | None,
    slo: SLO,
    workload: dict,
    soak_s: float,
    chosen: dict | None = None,
) -> TunedProfile:
    """The profile of a finished tune (`info` is the server's ServerInfo); `chosen`: the engine
    settings of the winning sweep point, recorded over what the server reported."""
    best = result.best_probe
    measured = soak or (best.summary if best else None)
    config = info.config or {}
    pct = f"p{slo.percentile:g}"
    capacity = {}
    if measured is not None:
        capacity = {
            "concurrency": result.best,
            "request_throughput": round(measured.request_throughput, 4),
            "output_token_throughput": round(measured.output_token_throughput, 2),
            "goodput": round(measured.goodput, 4),
            f"ttft_{pct}_s": measured.get("ttft_s", pct),
            f"tpot_{pct}_s": measured.get("tpot_s", pct),
            f"e2e_{pct}_s": measured.get("e2e_s", pct),
            "first_bad_concurrency": result.first_bad,
            "measured_during": "soak" if soak else "search",
        }
        bound = binding(result, slo)
        capacity["bound_by"] = ",".join(bound.bound_by)
        capacity["binding"] = bound.text
    return TunedProfile(
        name=name,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        hardware={
            "gpu": info.gpu_name or ("cpu" if info.device == "cpu" else None),
            "device": info.device,
        },
        model={"name": info.model, "dtype": info.dtype, "quantization": info.quantization},
        chosen={
            "max_concurrency": result.best,
            "max_num_seqs": result.best,
            "max_num_batched_tokens": config.get("max_num_batched_tokens"),
            "max_model_len": config.get("max_model_len"),
            "adaptive_batching": config.get("adaptive_batching"),
            **(chosen or {}),
        },
        capacity=capacity,
        slo={**slo.limits(), "percentile": slo.percentile},
        workload=workload,
        soak={
            "duration_s": soak_s,
            "stable": drift.stable if drift else None,
            "notes": drift.notes if drift else [],
        },
    )
