"""The soak's pure parts: how each request ended (the ledger that finds lost requests), what one
interval recorded, and the rules that fail a run (memory and latency drift, KV blocks held at
idle, 5xx answers, lost requests). No I/O: tests/test_soak.py checks every rule on synthetic
series."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from appliance.loadgen.report import percentile

MEMORY_DRIFT_LIMIT = 0.01
"""Largest allowed rise of RSS and GPU memory from the first interval after warm-up to the last."""
LATENCY_DRIFT_LIMIT = 0.10
"""Largest allowed rise of p99 TTFT and p99 TPOT from the first such interval to the last."""

KINDS = (
    "chat_stream",
    "chat",
    "completion_stream",
    "completion",
    "disconnect",
    "abort",
    "storm",
    "malformed",
)
"""What the load sends: the four ordinary requests; a stream closed after a few chunks; a
request cancelled right after it was sent; one of a burst past the server's queue limit; a
body the server must refuse with 400."""

ENDINGS = (
    "completed",
    "error_event",
    "rejected",
    "bad_request",
    "disconnected",
    "aborted",
    "http_4xx",
    "http_5xx",
    "timeout",
    "connection",
    "truncated",
)
"""How a request can end, seen by its client. completed: a whole answer (a stream up to
[DONE]); error_event: a stream that ended with an error event; rejected: 429; bad_request: 400;
disconnected / aborted: the client closed it on purpose; http_4xx: another 4xx; http_5xx: any
5xx; timeout: no end within the client's limit; connection: the connection failed before an
answer; truncated: a 200 whose stream or body ended before its end."""

LOST_ENDINGS = ("timeout", "connection", "truncated")
"""Endings that mean the server lost the request: it neither finished it nor said why."""


@dataclass
class Ledger:
    """Requests sent and how each ended, by kind. A request sent and never ended (its task
    vanished) is lost as surely as one that timed out."""

    sent: Counter = field(default_factory=Counter)
    ended: dict[str, Counter] = field(default_factory=dict)

    def send(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown request kind {kind!r}: one of {KINDS}")
        self.sent[kind] += 1

    def end(self, kind: str, ending: str) -> None:
        if ending not in ENDINGS:
            raise ValueError(f"unknown ending {ending!r}: one of {ENDINGS}")
        self.ended.setdefault(kind, Counter())[ending] += 1

    def lost(self) -> dict[str, int]:
        """Lost requests by kind: those with a lost ending plus those sent and never ended."""
        out = {}
        for kind in KINDS:
            ended = self.ended.get(kind, Counter())
            num = sum(ended[e] for e in LOST_ENDINGS) + self.sent[kind] - sum(ended.values())
            if num:
                out[kind] = num
        return out

    def count(self, ending: str) -> int:
        return sum(c[ending] for c in self.ended.values())

    def to_json(self) -> dict:
        return {
            "sent": dict(self.sent),
            "ended": {k: dict(v) for k, v in self.ended.items()},
            "lost": self.lost(),
        }


@dataclass
class Interval:
    """What one interval recorded: the load's latencies and endings while it ran, and the
    server's readings once it was idle at the interval's end (None: not reported)."""

    index: int
    t_start: float
    """Seconds from the run's start."""
    t_end: float
    num_sent_before: int = 0
    """Requests the soak had sent when the interval began."""
    ttft_s: list[float] = field(default_factory=list, repr=False)
    tpot_s: list[float] = field(default_factory=list, repr=False)
    endings: Counter = field(default_factory=Counter)
    rss_bytes: int | None = None
    """The server's resident memory, its engine core and other child processes included."""
    gpu_memory_bytes: int | None = None
    kv_blocks_idle: int | None = None
    """KV blocks in use once the load paused and the server had nothing in flight."""
    inflight_idle: int | None = None
    """Requests the server still held at that point."""

    def stats(self) -> dict:
        """The interval's figures (percentiles in seconds)."""
        return {
            "index": self.index,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "num_sent_before": self.num_sent_before,
            "ttft_p50": percentile(self.ttft_s, 50),
            "ttft_p99": percentile(self.ttft_s, 99),
            "tpot_p50": percentile(self.tpot_s, 50),
            "tpot_p99": percentile(self.tpot_s, 99),
            "num_streams": len(self.ttft_s),
            "rss_bytes": self.rss_bytes,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "kv_blocks_idle": self.kv_blocks_idle,
            "inflight_idle": self.inflight_idle,
            "endings": dict(self.endings),
        }


def drift(first: float | None, last: float | None) -> float | None:
    """The relative rise from `first` to `last`; None when either is missing or first is 0."""
    if first is None or last is None or first <= 0:
        return None
    return (last - first) / first


DRIFT_RULES = (
    ("rss_bytes", MEMORY_DRIFT_LIMIT),
    ("gpu_memory_bytes", MEMORY_DRIFT_LIMIT),
    ("ttft_p99", LATENCY_DRIFT_LIMIT),
    ("tpot_p99", LATENCY_DRIFT_LIMIT),
)
"""The series compared between the first interval after warm-up and the last, with the largest
rise each may take."""


def baseline_index(rows: list[dict], warmup_s: float, fill_requests: int = 0) -> int | None:
    """The first interval that starts at or after the warm-up, once fill_requests requests
    were sent before it (the server's stores of recent requests are full by then: their growth
    is not drift); None when none does."""
    return next(
        (
            i
            for i, r in enumerate(rows)
            if r["t_start"] >= warmup_s and r.get("num_sent_before", 0) >= fill_requests
        ),
        None,
    )


def drift_failures(rows: list[dict], warmup_s: float, fill_requests: int = 0) -> list[str]:
    """A reason for each series that rose past its limit between the first interval after
    warm-up (see baseline_index) and the last; a run with fewer than two such intervals fails
    as too short."""
    first = baseline_index(rows, warmup_s, fill_requests)
    if first is None or first >= len(rows) - 1:
        return [
            f"too short: {len(rows)} interval(s), need two starting after the {warmup_s:g} s "
            f"warm-up and after {fill_requests} requests (the records the server keeps; raise "
            "--duration or lower --interval / --warmup)"
        ]
    a, b = rows[first], rows[-1]
    reasons = []
    for key, limit in DRIFT_RULES:
        rise = drift(a.get(key), b.get(key))
        if rise is not None and rise > limit:
            reasons.append(
                f"{key} rose {100 * rise:.1f}% (limit {100 * limit:g}%): "
                f"{_fmt(key, a[key])} in interval {a['index']}, {_fmt(key, b[key])} in interval "
                f"{b['index']}"
            )
    return reasons


def verdict(rows: list[dict], ledger: Ledger, warmup_s: float, fill_requests: int = 0) -> list[str]:
    """Every reason the run fails (empty: it passes). fill_requests: requests to send before
    the baseline interval (the server's /v1/stats server.records_kept)."""
    reasons = drift_failures(rows, warmup_s, fill_requests)
    for r in rows:
        if r.get("kv_blocks_idle") is None:
            reasons.append(f"interval {r['index']}: no KV block reading at idle")
        elif r["kv_blocks_idle"] > 0:
            reasons.append(f"interval {r['index']}: {r['kv_blocks_idle']} KV blocks held at idle")
        if r.get("inflight_idle"):
            reasons.append(f"interval {r['index']}: {r['inflight_idle']} requests held at idle")
    refused = ledger.ended.get("malformed", Counter())
    if num := sum(refused.values()) - refused["bad_request"]:
        reasons.append(f"{num} malformed requests not refused with 400: {dict(refused)}")
    if num := ledger.count("http_5xx"):
        reasons.append(f"{num} answers with a 5xx status")
    for kind, num in ledger.lost().items():
        ended = dict(ledger.ended.get(kind, {}))
        reasons.append(f"{num} {kind} requests lost (sent {ledger.sent[kind]}, ended {ended})")
    return reasons


def _fmt(key: str, value: float) -> str:
    if key.endswith("_bytes"):
        return f"{value / 2**20:.1f} MiB"
    return f"{value * 1000:.1f} ms"


def summary_table(rows: list[dict]) -> str:
    """A markdown table of the intervals: latencies in ms, memory in MiB."""

    def cell(value, scale: float, digits: int) -> str:
        return "n/a" if value is None else f"{value / scale:.{digits}f}"

    lines = [
        "| # | t (s) | streams | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | RSS MiB | GPU MiB "
        "| KV idle | 429 | 400 | 5xx | lost |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        e = r.get("endings") or {}
        lost = sum(e.get(k, 0) for k in LOST_ENDINGS)
        lines.append(
            f"| {r['index']} | {r['t_end']:.0f} | {r['num_streams']} "
            f"| {cell(r['ttft_p50'], 1e-3, 1)} | {cell(r['ttft_p99'], 1e-3, 1)} "
            f"| {cell(r['tpot_p50'], 1e-3, 1)} | {cell(r['tpot_p99'], 1e-3, 1)} "
            f"| {cell(r['rss_bytes'], 2**20, 1)} | {cell(r['gpu_memory_bytes'], 2**20, 1)} "
            f"| {cell(r['kv_blocks_idle'], 1, 0)} | {e.get('rejected', 0)} "
            f"| {e.get('bad_request', 0)} | {e.get('http_5xx', 0)} | {lost} |"
        )
    return "\n".join(lines)
