"""KeyStats: who uses the GPU: per-key counters (requests, 429s, in flight, prompt and generated
tokens, queue time) for the "keys" section of /v1/stats and the key-labelled series of /metrics.

Requests without an API key (keys off) count under "anonymous". A request counts in
requests_total when it is admitted (past its key's limits and the server's queue), in
rejected_total when it gets a 429. Its tokens and queue time count when it closes, however it
ends: a request cut short used the GPU for what it produced. Queue time is arrival to first
scheduled, the longest of its choices'.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from appliance.key_limits import ANONYMOUS
from appliance.server.records import RequestRecord

_ZERO = {
    "requests_total": 0,
    "rejected_total": 0,
    "running": 0,
    "prompt_tokens_total": 0,
    "generation_tokens_total": 0,
    "queue_seconds_total": 0.0,
}


class KeyStats:
    """Counters by key name, and by key name and model (for /metrics' model_name label);
    `closed` is a StatsTracker.on_finish sink."""

    def __init__(self) -> None:
        self.keys: dict[str, dict] = {}
        self.by_model: dict[tuple[str, str], dict] = {}
        """(key name, model name) -> the same counters, for the requests that named it."""

    def declare(self, name: str, priority: str) -> None:
        """A key the server accepts (shown with zeros until it is used) and its class."""
        self.keys[name] = {"priority": priority, **_ZERO}

    def _entries(self, name: str | None, model: str | None) -> list[dict]:
        """The key's entry and, when the model is known, its (key, model) entry."""
        name = name or ANONYMOUS
        if name not in self.keys:
            self.declare(name, "interactive")
        entry = self.keys[name]
        if model is None:
            return [entry]
        per_model = self.by_model.setdefault((name, model), dict(_ZERO))
        return [entry, per_model]

    def admitted(self, name: str | None, model: str | None = None) -> None:
        for entry in self._entries(name, model):
            entry["requests_total"] += 1
            entry["running"] += 1

    def rejected(self, name: str | None, model: str | None = None) -> None:
        for entry in self._entries(name, model):
            entry["rejected_total"] += 1

    def closed(self, record: RequestRecord) -> None:
        queue = [c.queue_s for c in record.choices if c.queue_s is not None]
        for entry in self._entries(record.key_name, record.model):
            entry["running"] -= 1
            entry["prompt_tokens_total"] += record.prompt_tokens
            entry["generation_tokens_total"] += record.completion_tokens
            if queue:
                entry["queue_seconds_total"] += max(queue)

    def snapshot(self) -> dict[str, dict]:
        """/v1/stats' "keys": {NAME: {"priority", "requests_total", "rejected_total",
        "running", "prompt_tokens_total", "generation_tokens_total", "queue_seconds_total"}}."""
        return {name: dict(entry) for name, entry in self.keys.items()}

    def series(self, default_model: str) -> list[tuple[str, str, str, dict]]:
        """(key, priority, model name, counters) for /metrics: each key by the models its
        requests named; a key no request has used yet, zeros under `default_model`."""
        out = [
            (key, self.keys[key]["priority"], model, entry)
            for (key, model), entry in self.by_model.items()
        ]
        used = {key for key, _ in self.by_model}
        out += [
            (key, e["priority"], default_model, e)
            for key, e in self.keys.items()
            if key not in used
        ]
        return out


class KeyCollector:
    """KeyStats as Prometheus series with `key`, `priority` and `model_name` labels, read at
    scrape time."""

    COUNTERS = {
        "appliance:key_requests": ("Requests admitted, by API key.", "requests_total"),
        "appliance:key_requests_rejected": ("Requests refused with 429.", "rejected_total"),
        "appliance:key_prompt_tokens": ("Prompt tokens of closed requests.", "prompt_tokens_total"),
        "appliance:key_generation_tokens": (
            "Tokens generated for closed requests.",
            "generation_tokens_total",
        ),
        "appliance:key_queue_seconds": (
            "Seconds closed requests waited from arrival to first scheduled, summed (divide "
            "by appliance:key_requests for the mean).",
            "queue_seconds_total",
        ),
    }

    def __init__(self, stats: KeyStats, default_model: Callable[[], str]) -> None:
        self.stats = stats
        self.default_model = default_model
        """The model name a key's series carry before any request of it named a model."""

    def collect(self):
        series = self.stats.series(self.default_model())
        labels = ["key", "priority", "model_name"]
        for name, (doc, field) in self.COUNTERS.items():
            c = CounterMetricFamily(name, doc, labels=labels)
            for key, priority, model, entry in series:
                c.add_metric([key, priority, model], entry[field])
            yield c
        g = GaugeMetricFamily(
            "appliance:key_requests_running", "Requests in flight now.", labels=labels
        )
        for key, priority, model, entry in series:
            g.add_metric([key, priority, model], entry["running"])
        yield g
