"""StatsTracker: recent request records, latency percentiles, throughput, GPU readings, and the
/v1/stats document (also streamed as SSE for the dashboard)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from appliance.server.key_stats import KeyStats
from appliance.server.records import RequestRecord
from appliance.server.state import ServerState
from engine.planner import nvml

logger = logging.getLogger("appliance.server")
MAX_RECORDS = 1000
LATENCY_WINDOW = 1000
THROUGHPUT_WINDOW_S = 10.0
PREFIX_CACHE_WINDOW_S = 60.0
"""The window of /v1/stats' prefix-cache hit rate: the last minute."""
GPU_READ_INTERVAL_S = 0.5
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
        self._tokens = CounterWindow(
            THROUGHPUT_WINDOW_S, ("prompt_tokens_total", "generation_tokens_total")
        )
        self._prefix_cache = CounterWindow(
            PREFIX_CACHE_WINDOW_S, ("prefix_cache_queries_total", "prefix_cache_hits_total")
        )
        self.on_finish: list[Callable[[RequestRecord], None]] = []
        """Sinks called with each closed record (metrics, request log)."""
        self.gpu = GpuReader()
        self.keys = KeyStats()

    def add(self, record: RequestRecord) -> None:
        self.counters["requests_total"] += 1
        self.records[record.request_id] = record
        self.records.move_to_end(record.request_id)
        while len(self.records) > MAX_RECORDS:
            self.records.popitem(last=False)

    def rejected(self) -> None:
        self.counters["rejected_total"] += 1

    def observe_itl(self, seconds: float, count: int = 1) -> None:
        self.latency["itl_s"].extend([seconds] * count)

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
        """Remember engine counters over time for the throughput and hit-rate figures."""
        now = time.time() if now is None else now
        self._tokens.add(now, stats)
        self._prefix_cache.add(now, stats)

    def throughput(self) -> dict:
        dt, (prompt, generation) = self._tokens.deltas()
        if dt <= 0:
            return {"prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 0.0, "window_s": 0.0}
        return {
            "prompt_tokens_per_s": prompt / dt,
            "generation_tokens_per_s": generation / dt,
            "window_s": dt,
        }

    def prefix_cache(self, estats: dict) -> dict:
        """Whether the engine caches prefixes, and the prompt tokens it looked up and found
        over the last PREFIX_CACHE_WINDOW_S (hit_rate_perc None when it looked up none)."""
        dt, (queries, hits) = self._prefix_cache.deltas()
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
        """The /v1/stats document."""
        engine = state.engine
        estats = state.core.stats() if state.core else {}
        total = estats.get("kv_blocks_total") or 0
        used = estats.get("kv_blocks_used") or 0
        records = list(self.records.values())
        running = [r for r in records if r.finished_at is None]
        recent = [r for r in reversed(records) if r.finished_at is not None]
        settings = state.settings
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
        return {
            "object": "appliance.stats",
            "time": time.time(),
            "status": state.phase.value,
            "model": state.model_name,
            "model_params": _model_params(engine),
            "uptime_s": time.time() - state.started_at,
            "device": str(engine.device) if engine is not None else None,
            "config": dataclasses.asdict(engine.config) if engine is not None else None,
            "plan": _plan(engine),
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
            "engine": {**estats, "kv_usage_perc": 100.0 * used / total if total else 0.0},
            "kv": {
                **_kv_section(kv_by_request if kv_known else None, used, total, estats),
                "blocks_cached": estats.get("kv_blocks_cached"),
                "prefix_cache": self.prefix_cache(estats),
            },
            "queue": {
                "num_waiting": estats.get("num_waiting", 0),
                "num_running": estats.get("num_running", 0),
                "rejected_total": self.counters["rejected_total"],
                "timed_out_total": sum(self.counters["timeouts_total"].values()),
            },
            "gpu": self.gpu.read(engine.device if engine is not None else None),
            "requests_in_flight": sum(len(s.inflight) for s in state.serving_states()),
            "models": state.models_summary(),
            "counters": self.counters,
            "keys": self.keys.snapshot(),
            "throughput": self.throughput(),
            "latency": {k: percentiles(list(v)) for k, v in self.latency.items()},
            "requests": rows,
            "traces": [r.trace() for r in recent[:num_traces]],
        }


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


class GpuReader:
    """GPU readings through NVML (engine.planner.nvml), cached for GPU_READ_INTERVAL_S.

    Every field is None when it cannot be read: no NVML, no GPU, a CPU engine, or a reading the
    board does not support. It never raises.
    """

    FIELDS = (
        "name",
        "utilization_perc",
        "memory_used_bytes",
        "memory_total_bytes",
        "power_w",
        "temperature_c",
        "sm_clock_mhz",
    )

    def __init__(self) -> None:
        self._nvml = None
        self._failed = False
        self._cache: tuple[float, dict] | None = None

    def read(self, device) -> dict:
        now = time.monotonic()
        if self._cache is not None and now - self._cache[0] < GPU_READ_INTERVAL_S:
            return self._cache[1]
        reading = dict.fromkeys(self.FIELDS)
        handle = self._handle(device)
        if handle is not None:
            reading.update(self._readings(handle))
        self._cache = (now, reading)
        return reading

    def _handle(self, device):
        kind, _, number = str(device).partition(":")  # "cuda:0" (a torch.device or its name)
        if device is None or kind != "cuda":
            return None
        lib = self._init()
        if lib is None:
            return None
        return nvml.handle(lib, int(number) if number.isdigit() else 0)

    def _init(self):
        if self._nvml is not None or self._failed:
            return self._nvml
        try:
            self._nvml = nvml.load()
        except Exception as exc:
            logger.info("GPU readings unavailable (NVML: %s)", exc)
            self._failed = True
        return self._nvml

    def _readings(self, handle) -> dict:
        lib = self._nvml
        getters = {
            "name": lambda: nvml.text(lib.nvmlDeviceGetName(handle)),
            "utilization_perc": lambda: float(lib.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory_used_bytes": lambda: int(lib.nvmlDeviceGetMemoryInfo(handle).used),
            "memory_total_bytes": lambda: int(lib.nvmlDeviceGetMemoryInfo(handle).total),
            "power_w": lambda: lib.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "temperature_c": lambda: float(
                lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)
            ),
            "sm_clock_mhz": lambda: float(lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM)),
        }
        out: dict = {}
        for key, get in getters.items():
            try:
                out[key] = get()
            except Exception:  # unsupported on this board, or the GPU went away
                out[key] = None
        return out


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
