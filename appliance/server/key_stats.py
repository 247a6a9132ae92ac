"""KeyStats: who uses the GPU: per-key counters (requests, 429s, in flight, prompt and generated
tokens, queue time) for the "keys" section of /v1/stats and the key-labelled series of /metrics.

Requests without an API key (keys off) count under "anonymous". A request counts in
requests_total when it is admitted (past its key's limits and the server's queue), in
rejected_total when it gets a 429. Its tokens and queue time count when it closes, however it
ends: a request cut short used the GPU for what it produced. Queue time is arrival to first
scheduled, the longest of its choices'.
"""

from __future__ import annotations

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
    """Counters by key name; `closed` is a StatsTracker.on_finish sink."""

    def __init__(self) -> None:
        self.keys: dict[str, dict] = {}

    def declare(self, name: str, priority: str) -> None:
        """A key the server accepts (shown with zeros until it is used) and its class."""
        self.keys[name] = {"priority": priority, **_ZERO}

    def _entry(self, name: str | None) -> dict:
        name = name or ANONYMOUS
        if name not in self.keys:
            self.declare(name, "interactive")
        return self.keys[name]

    def admitted(self, name: str | None) -> None:
        entry = self._entry(name)
        entry["requests_total"] += 1
        entry["running"] += 1

    def rejected(self, name: str | None) -> None:
        self._entry(name)["rejected_total"] += 1

    def closed(self, record: RequestRecord) -> None:
        entry = self._entry(record.key_name)
        entry["running"] -= 1
        entry["prompt_tokens_total"] += record.prompt_tokens
        entry["generation_tokens_total"] += record.completion_tokens
        queue = [c.queue_s for c in record.choices if c.queue_s is not None]
        if queue:
            entry["queue_seconds_total"] += max(queue)

    def snapshot(self) -> dict[str, dict]:
        """/v1/stats' "keys": {NAME: {"priority", "requests_total", "rejected_total",
        "running", "prompt_tokens_total", "generation_tokens_total", "queue_seconds_total"}}."""
        return {name: dict(entry) for name, entry in self.keys.items()}


class KeyCollector:
    """KeyStats as Prometheus series with a `key` label, read at scrape time."""

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

    def __init__(self, stats: KeyStats) -> None:
        self.stats = stats

    def collect(self):
        keys = self.stats.snapshot()
        for name, (doc, field) in self.COUNTERS.items():
            c = CounterMetricFamily(name, doc, labels=["key", "priority"])
            for key, entry in keys.items():
                c.add_metric([key, entry["priority"]], entry[field])
            yield c
        g = GaugeMetricFamily(
            "appliance:key_requests_running", "Requests in flight now.", labels=["key", "priority"]
        )
        for key, entry in keys.items():
            g.add_metric([key, entry["priority"]], entry["running"])
        yield g
