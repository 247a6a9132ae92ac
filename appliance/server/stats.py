"""StatsTracker: recent request records, latency percentiles, throughput, and the /v1/stats
document (also streamed as SSE for the dashboard)."""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from appliance.server.records import RequestRecord
from appliance.server.state import ServerState

MAX_RECORDS = 1000
LATENCY_WINDOW = 1000
THROUGHPUT_WINDOW_S = 10.0


def percentiles(values: list[float]) -> dict:
    """p50/p90/p95/p99 (nearest rank), mean and count; None values when empty."""
    if not values:
        return {"p50": None, "p90": None, "p95": None, "p99": None, "mean": None, "count": 0}
    s = sorted(values)

    def rank(q: float) -> float:
        return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]

    return {
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p95": rank(0.95),
        "p99": rank(0.99),
        "mean": sum(s) / len(s),
        "count": len(s),
    }


class StatsTracker:
    """Keeps the last MAX_RECORDS requests and the recent latency samples; counts outcomes."""

    def __init__(self) -> None:
        self.records: OrderedDict[str, RequestRecord] = OrderedDict()
        self.latency: dict[str, deque[float]] = {
            k: deque(maxlen=LATENCY_WINDOW)
            for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s")
        }
        self.counters = {
            "requests_total": 0,
            "finished_total": 0,
            "rejected_total": 0,
            "errors_total": 0,
            "cancelled_total": 0,
            "timeouts_total": {"ttft_timeout": 0, "request_timeout": 0, "stall_timeout": 0},
        }
        self._engine_samples: deque[tuple[float, int, int]] = deque()
        self.on_finish: list[Callable[[RequestRecord], None]] = []
        """Sinks called with each closed record (metrics, request log)."""

    def add(self, record: RequestRecord) -> None:
        self.counters["requests_total"] += 1
        self.records[record.request_id] = record
        self.records.move_to_end(record.request_id)
        while len(self.records) > MAX_RECORDS:
            self.records.popitem(last=False)

    def rejected(self) -> None:
        self.counters["rejected_total"] += 1

    def observe_itl(self, seconds: float) -> None:
        self.latency["itl_s"].append(seconds)

    def finish(self, record: RequestRecord) -> None:
        """Count a closed record and feed its latencies to the windows and the sinks."""
        if record.status == "finished":
            self.counters["finished_total"] += 1
            for key in ("ttft_s", "e2e_s"):
                value = getattr(record, key)
                if value is not None:
                    self.latency[key].append(value)
            for c in record.choices:
                if c.tpot_s is not None:
                    self.latency["tpot_s"].append(c.tpot_s)
                if c.queue_s is not None:
                    self.latency["queue_s"].append(c.queue_s)
        elif record.status == "timeout":
            code = (record.error or "").split(":", 1)[0]
            if code in self.counters["timeouts_total"]:
                self.counters["timeouts_total"][code] += 1
        elif record.status == "cancelled":
            self.counters["cancelled_total"] += 1
        else:
            self.counters["errors_total"] += 1
        for sink in self.on_finish:
            sink(record)

    def sample_engine(self, stats: dict, now: float | None = None) -> None:
        """Remember engine token counters over time for the throughput figures."""
        now = time.time() if now is None else now
        samples = self._engine_samples
        samples.append((now, stats["prompt_tokens_total"], stats["generation_tokens_total"]))
        while len(samples) > 2 and now - samples[0][0] > THROUGHPUT_WINDOW_S:
            samples.popleft()

    def throughput(self) -> dict:
        s = self._engine_samples
        if len(s) < 2 or s[-1][0] <= s[0][0]:
            return {"prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 0.0, "window_s": 0.0}
        dt = s[-1][0] - s[0][0]
        return {
            "prompt_tokens_per_s": (s[-1][1] - s[0][1]) / dt,
            "generation_tokens_per_s": (s[-1][2] - s[0][2]) / dt,
            "window_s": dt,
        }

    def mean_e2e(self) -> float:
        e2e = self.latency["e2e_s"]
        return sum(e2e) / len(e2e) if e2e else 1.0

    def snapshot(self, state: ServerState, num_traces: int = 10, num_rows: int = 50) -> dict:
        """The /v1/stats document."""
        engine = state.engine
        estats = state.async_engine.stats() if state.async_engine else {}
        total = estats.get("kv_blocks_total") or 0
        used = estats.get("kv_blocks_used") or 0
        records = list(self.records.values())
        running = [r for r in records if r.finished_at is None]
        recent = [r for r in reversed(records) if r.finished_at is not None]
        settings = state.settings
        return {
            "object": "appliance.stats",
            "time": time.time(),
            "status": state.phase.value,
            "model": state.model_name,
            "uptime_s": time.time() - state.started_at,
            "device": str(engine.device) if engine is not None else None,
            "config": dataclasses.asdict(engine.config) if engine is not None else None,
            "plan": _plan(engine),
            "server": {
                "max_queue": settings.max_queue,
                "auth": bool(settings.api_keys),
                "timeouts_s": {
                    "request": settings.request_timeout,
                    "ttft": settings.ttft_timeout,
                    "stall": settings.stall_timeout,
                    "drain": settings.drain_timeout,
                },
            },
            "engine": {**estats, "kv_usage_perc": 100.0 * used / total if total else 0.0},
            "requests_in_flight": len(state.inflight),
            "counters": self.counters,
            "throughput": self.throughput(),
            "latency": {k: percentiles(list(v)) for k, v in self.latency.items()},
            "requests": [r.summary() for r in (running + recent)[:num_rows]],
            "traces": [r.trace() for r in recent[:num_traces]],
        }


def _plan(engine) -> dict | None:
    plan = getattr(engine, "plan", None)
    if plan is None:
        return None
    if dataclasses.is_dataclass(plan):
        return dataclasses.asdict(plan)
    return plan if isinstance(plan, dict) else {"summary": str(plan)}
