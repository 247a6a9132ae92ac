"""StatsTracker: recent request records, latency percentiles, throughput, GPU readings, and the
/v1/stats document (also streamed as SSE for the dashboard); with several models, each model's
row and each loaded model's engine sections ("by_model")."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from appliance.server.gpu_reading import GpuReader
from appliance.server.key_stats import KeyStats
from appliance.server.model_stats import ModelCounts, record_latency
from appliance.server.records import RequestRecord
from appliance.server.state import ServerState

MAX_RECORDS = 1000
LATENCY_WINDOW = 1000
THROUGHPUT_WINDOW_S = 10.0
PREFIX_CACHE_WINDOW_S = 60.0
"""The window of /v1/stats' prefix-cache hit rate: the last minute."""
NUM_TOP_KV = 3


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
        self._tokens: dict[str | None, CounterWindow] = {}
        """Each model's token counters (None: samples that name no model)."""
        self._prefix_cache: dict[str | None, CounterWindow] = {}
        self.models: dict[str, ModelCounts] = {}
        """Request counts by the records' model name."""
        self.on_finish: list[Callable[[RequestRecord], None]] = []
        """Sinks called with each closed record (metrics, request log)."""
        self.gpu = GpuReader()
        self.keys = KeyStats()

    def add(self, record: RequestRecord) -> None:
        self.counters["requests_total"] += 1
        counts = self._model(record.model)
        counts.requests_total += 1
        counts.last_request_at = record.received_at
        self.records[record.request_id] = record
        self.records.move_to_end(record.request_id)
        while len(self.records) > MAX_RECORDS:
            self.records.popitem(last=False)

    def rejected(self, model: str | None = None) -> None:
        """Count a 429 (for `model` too, when named)."""
        self.counters["rejected_total"] += 1
        if model is not None:
            self._model(model).rejected_total += 1

    def _model(self, name: str) -> ModelCounts:
        return self.models.setdefault(name, ModelCounts())

    def observe_itl(self, seconds: float, count: int = 1) -> None:
        self.latency["itl_s"].extend([seconds] * count)

    def finish(self, record: RequestRecord) -> None:
        """Count a closed record and feed its latencies to the windows and the sinks."""
        if record.status == "finished":
            self.counters["finished_total"] += 1
            self._model(record.model).finished_total += 1
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
            self._model(record.model).timed_out_total += 1
        elif record.status == "cancelled":
            self.counters["cancelled_total"] += 1
        else:
            self.counters["errors_total"] += 1
        for sink in self.on_finish:
            sink(record)

    def sample_engine(
        self, stats: dict, now: float | None = None, model: str | None = None
    ) -> None:
        """Remember `model`'s engine counters over time for its throughput and hit rate."""
        now = time.time() if now is None else now
        if model not in self._tokens:
            keys = ("prompt_tokens_total", "generation_tokens_total")
            self._tokens[model] = CounterWindow(THROUGHPUT_WINDOW_S, keys)
            keys = ("prefix_cache_queries_total", "prefix_cache_hits_total")
            self._prefix_cache[model] = CounterWindow(PREFIX_CACHE_WINDOW_S, keys)
        self._tokens[model].add(now, stats)
        self._prefix_cache[model].add(now, stats)

    def throughput(self, model: str | None = None) -> dict:
        """`model`'s tokens per second over the last THROUGHPUT_WINDOW_S (zeros unsampled)."""
        dt, (prompt, generation) = _deltas(self._tokens.get(model), 2)
        if dt <= 0:
            return {"prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 0.0, "window_s": 0.0}
        return {
            "prompt_tokens_per_s": prompt / dt,
            "generation_tokens_per_s": generation / dt,
            "window_s": dt,
        }

    def prefix_cache(self, estats: dict, model: str | None = None) -> dict:
        """Whether `model`'s engine caches prefixes, and the prompt tokens it looked up and
        found over the last PREFIX_CACHE_WINDOW_S (hit_rate_perc None when it looked up none)."""
        dt, (queries, hits) = _deltas(self._prefix_cache.get(model), 2)
        return {
            "enabled": estats.get("prefix_caching"),
            "hit_rate_perc": 100.0 * hits / queries if queries > 0 else None,
            "queries": queries,
            "hits": hits,
            "window_s": dt,
        }

    def mean_e2e(self) -> float:
        e2e = self.latency["e2e_s"]
        return sum(e2e) / len(e2e) if e2e else 1.0

    def snapshot(self, state: ServerState, num_traces: int = 10, num_rows: int = 50) -> dict:
        """The /v1/stats document: the server's figures, the engine sections (ENGINE_SECTIONS)
        of the model used last, and with several models each one's row ("models") and each
        loaded one's engine sections by name ("by_model"; an unloaded model has none)."""
        engine = state.engine
        settings = state.settings
        records = list(self.records.values())
        models = state.models_summary()
        by_model = None
        if models is not None:
            for row in models:
                row.update(self.models.get(row["name"], ModelCounts()).as_dict())
            by_model = {
                s.model_name: self._engine_sections(
                    s,
                    [r for r in records if r.model == s.model_name],
                    num_traces,
                    num_rows,
                    latency=None,
                )
                for s in state.serving_states()
            }
        latency = {k: percentiles(list(v)) for k, v in self.latency.items()}
        return {
            "object": "appliance.stats",
            "time": time.time(),
            "status": state.phase.value,
            **self._engine_sections(state, records, num_traces, num_rows, latency),
            "uptime_s": time.time() - state.started_at,
            "server": {
                "pid": os.getpid(),
                "api_workers": settings.api_workers,
                "max_queue": settings.max_queue,
                "records_kept": MAX_RECORDS,
                "auth": bool(settings.api_keys),
                "timeouts_s": {
                    "request": settings.request_timeout,
                    "ttft": settings.ttft_timeout,
                    "stall": settings.stall_timeout,
                    "drain": settings.drain_timeout,
                },
                "generation_defaults": state.defaults.as_dict(),
            },
            "gpu": self.gpu.read(engine.device if engine is not None else None),
            "requests_in_flight": sum(len(s.inflight) for s in state.serving_states()),
            "models": models,
            "by_model": by_model,
            "counters": self.counters,
            "keys": self.keys.snapshot(),
        }

    def _engine_sections(
        self,
        state: ServerState,
        records: list[RequestRecord],
        num_traces: int,
        num_rows: int,
        latency: dict | None,
    ) -> dict:
        """ENGINE_SECTIONS of one engine's state; `records` are the requests it lists, `latency`
        its percentiles (None: over `records`). Queue counts of 429s and timeouts are the
        server's at the top level, the model's own under by_model."""
        engine = state.engine
        estats = state.core.stats() if state.core else {}
        total = estats.get("kv_blocks_total") or 0
        used = estats.get("kv_blocks_used") or 0
        running = [r for r in records if r.finished_at is None]
        recent = [r for r in reversed(records) if r.finished_at is not None]
        kv_by_request = _kv_by_request(state.core, running)
        kv_known = kv_by_request is not None
        kv_by_request = kv_by_request or {}
        rows = [
            {
                **r.summary(),
                "kv_blocks": kv_by_request.get(r.request_id, 0) if kv_known else None,
            }
            for r in (running + recent)[:num_rows]
        ]
        name = state.model_name
        if latency is None:
            counts = self.models.get(name, ModelCounts())
            refused = (counts.rejected_total, counts.timed_out_total)
        else:
            refused = (
                self.counters["rejected_total"],
                sum(self.counters["timeouts_total"].values()),
            )
        sections = {
            "model": name,
            "model_params": _model_params(engine),
            "device": str(engine.device) if engine is not None else None,
            "config": dataclasses.asdict(engine.config) if engine is not None else None,
            "plan": _plan(engine),
            "engine": {**estats, "kv_usage_perc": 100.0 * used / total if total else 0.0},
            "kv": {
                **_kv_section(kv_by_request if kv_known else None, used, total, estats),
                "blocks_cached": estats.get("kv_blocks_cached"),
                "prefix_cache": self.prefix_cache(estats, name),
            },
            "queue": {
                "num_waiting": estats.get("num_waiting", 0),
                "num_running": estats.get("num_running", 0),
                "rejected_total": refused[0],
                "timed_out_total": refused[1],
            },
            "throughput": self.throughput(name),
            "latency": latency if latency is not None else record_latency(records, percentiles),
            "requests_in_flight": len(state.inflight),
            "requests": rows,
            "traces": [r.trace() for r in recent[:num_traces]],
        }
        return sections


class CounterWindow:
    """Samples of some monotonic engine counters over about the last `window_s` seconds."""

    def __init__(self, window_s: float, keys: tuple[str, ...]) -> None:
        self.window_s, self.keys = window_s, keys
        self.samples: deque[tuple[float, ...]] = deque()

    def add(self, now: float, stats: dict) -> None:
        """Take in the counters as of `now` (an engine without one counts 0)."""
        self.samples.append((now, *(stats.get(k) or 0 for k in self.keys)))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()

    def deltas(self) -> tuple[float, tuple[float, ...]]:
        """(seconds between the oldest and newest sample, how much each counter rose); zeros
        until two samples span some time."""
        s = self.samples
        if len(s) < 2 or s[-1][0] <= s[0][0]:
            return 0.0, (0,) * len(self.keys)
        return s[-1][0] - s[0][0], tuple(b - a for a, b in zip(s[0][1:], s[-1][1:], strict=True))


def _deltas(window: CounterWindow | None, num_keys: int) -> tuple[float, tuple[float, ...]]:
    return window.deltas() if window is not None else (0.0, (0,) * num_keys)


def _kv_by_request(core, running: list[RequestRecord]) -> dict[str, int] | None:
    """KV blocks held by each in-flight HTTP request (the sum over its choices), as the core
    last sent them (a few times a second); None when the engine does not say."""
    by_engine_id = core.kv_blocks_by_request() if core is not None else None
    if by_engine_id is None:
        return None
    out: dict[str, int] = {}
    for record in running:
        blocks = [by_engine_id[c.engine_id] for c in record.choices if c.engine_id in by_engine_id]
        out[record.request_id] = sum(blocks)
    return out


def _kv_section(by_request: dict[str, int] | None, used: int, total: int, estats: dict) -> dict:
    """Used/total blocks, the largest holders and the share of used blocks they hold (None
    when the engine does not report blocks per request)."""
    items = (by_request or {}).items()
    top = sorted(((b, rid) for rid, b in items if b > 0), reverse=True)[:NUM_TOP_KV]
    # The engine's counters are as of its last step, the block tables as of now: divide by
    # whichever is larger so that shares stay within 100%.
    base = max(used, sum(b for _, b in items))
    return {
        "blocks_used": used,
        "blocks_total": total,
        "usage_perc": 100.0 * used / total if total else 0.0,
        "num_preemptions_total": estats.get("num_preemptions_total", 0),
        "top_requests": [
            {"id": rid, "blocks": b, "share_perc": 100.0 * b / base} for b, rid in top
        ],
        "top_share_perc": None
        if by_request is None
        else (100.0 * sum(b for b, _ in top) / base if base else 0.0),
    }


def _model_params(engine) -> dict:
    """The model's parameters from its plan: total (every expert) and active (what one token
    reads; equal for a dense model); each None where the engine has no plan."""
    plan = _plan(engine) or {}
    return {"total": plan.get("num_params"), "active": plan.get("num_active_params")}


def _plan(engine) -> dict | None:
    """The engine's plan and its memory check (LLMEngine.plan_report); None for an engine
    without one (a test's stand-in)."""
    report = getattr(engine, "plan_report", None)
    return report() if report is not None else None
