"""What the tuner believes of a probe: the one-off disturbances that get a probe measured
again (Triton compiles the server reports, a pause in every stream at once), and which SLO
limit, or the concurrency cap, bound the tune's answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.loadgen.client import RequestResult
from appliance.loadgen.report import SLO, LevelSummary

MAX_ERROR_FRAC = 0.01
"""More failed requests than this share breaks the SLO, whatever the latencies."""
MAX_REPEATS = 2
"""A disturbed probe is measured again at most this many times; the last try is then believed
(and the report says it was disturbed)."""
STALL_FACTOR = 10.0
STALL_MIN_S = 0.5
"""A stall: every stream that had started answering waited at once, with no token to any of
them, for more than STALL_FACTOR x the probe's p50 inter-token latency and more than
STALL_MIN_S. Overload slows every step a little; a kernel compile, a swap or a paused process
stops all of them once."""


@dataclass
class Measured:
    """One try at a concurrency: its figures, and why not to believe them (empty: nothing
    seen)."""

    summary: LevelSummary
    disturbances: list[str] = field(default_factory=list)


def compiles_reported(stats: dict | None) -> int | None:
    """The server's count of Triton compiles after its warm-up (/v1/stats engine section);
    None when it does not say."""
    return ((stats or {}).get("engine") or {}).get("compiles_after_warmup")


def longest_silence(results: list[RequestResult]) -> tuple[float, float]:
    """The longest time (seconds, and when it began) between two consecutive token arrivals,
    over every stream, while some stream was between two of its tokens (it had a token at or
    before the gap's start and another at or after its end). Gaps before a request's first
    token (queueing, prefill) are not counted."""
    spans, arrivals = [], []
    for r in results:
        if not r.ok or r.ttft_s is None:
            continue
        t = r.start + r.ttft_s
        times = [t]
        for gap in r.itl_s:
            t += gap
            times.append(t)
        arrivals += times
        if len(times) > 1:
            spans.append((times[0], times[-1]))
    arrivals.sort()
    longest = (0.0, 0.0)
    for a, b in zip(arrivals, arrivals[1:]):
        if b - a > longest[0] and any(first <= a and last >= b for first, last in spans):
            longest = (b - a, a)
    return longest


def disturbances(
    summary: LevelSummary,
    results: list[RequestResult],
    compiles_before: int | None,
    compiles_after: int | None,
) -> list[str]:
    """Why a probe's figures are not its concurrency's: compiles the server reported between
    the probe's start and end, or a stall (STALL_FACTOR)."""
    found = []
    if compiles_before is not None and compiles_after is not None:
        if compiles_after > compiles_before:
            found.append(f"{compiles_after - compiles_before} Triton kernels compiled during it")
    p50 = summary.get("itl_s", "p50") or 0.0
    gap, at = longest_silence(results)
    if gap > max(STALL_MIN_S, STALL_FACTOR * p50):
        found.append(
            f"every stream stalled {gap:.2f}s at once (t={at:.1f}s; p50 ITL {p50 * 1000:.1f}ms)"
        )
    return found


def _show(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1.0 else f"{seconds * 1000:.1f} ms"


def broken_limits(summary: LevelSummary, slo: SLO) -> list[str]:
    """The SLO limits (ttft, tpot, e2e) a level broke at the SLO's percentile, and 'errors'
    when too many requests failed."""
    out = []
    failed = summary.num_requests - summary.num_ok
    if summary.num_ok == 0 or failed > MAX_ERROR_FRAC * summary.num_requests:
        out.append("errors")
    pct = f"p{slo.percentile:g}"
    for metric, limit in slo.limits().items():
        value = summary.get(metric, pct)
        if value is not None and value > limit:
            out.append(metric[:-2])
    return out


def readings(summary: LevelSummary, slo: SLO) -> str:
    """'p95 TTFT 1.90 s within 2.00 s, p95 TPOT 21.0 ms > 30.0 ms' for every limit."""
    pct = f"p{slo.percentile:g}"
    parts = []
    for metric, limit in slo.limits().items():
        value = summary.get(metric, pct)
        if value is None:
            parts.append(f"{pct} {metric[:-2].upper()} n/a")
            continue
        verdict = f"> {_show(limit)}" if value > limit else f"within {_show(limit)}"
        parts.append(f"{pct} {metric[:-2].upper()} {_show(value)} {verdict}")
    return ", ".join(parts)


@dataclass
class Binding:
    """What ended the search."""

    bound_by: list[str]
    """The limits the first bad concurrency broke ('ttft', 'tpot', 'e2e', 'errors'), or
    ['max_concurrency'] when the cap was reached within the SLOs."""
    text: str


def binding(result, slo: SLO) -> Binding:
    """Which SLO limit, or the concurrency cap, bound `result` (a tune.SearchResult)."""
    believed = {p.concurrency: p for p in result.probes}  # the last probe at each value
    good = believed.get(result.best) if result.best is not None else None
    bad = believed.get(result.first_bad) if result.first_bad is not None else None
    if bad is None:
        text = f"the concurrency cap bound it: {result.best} met the SLOs"
        if good is not None:
            text += f" ({readings(good.summary, slo)})"
        return Binding(["max_concurrency"], text)
    limits = broken_limits(bad.summary, slo)
    at_bad = f"at {bad.concurrency}: {readings(bad.summary, slo)}"
    if "errors" in limits:
        failed = bad.summary.num_requests - bad.summary.num_ok
        at_bad += f"; {failed}/{bad.summary.num_requests} requests failed"
    if good is None:
        return Binding(limits, f"no concurrency met the SLOs; {at_bad}")
    text = f"stopped at {good.concurrency}: {at_bad}; at {good.concurrency}: "
    return Binding(limits, text + readings(good.summary, slo))
