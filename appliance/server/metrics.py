"""Prometheus metrics under vLLM's names (so existing vLLM dashboards work), one registry per app;
every series carries the model_name label (with several models, one series per model).

Engine gauges and counters are read from the engine core's last stats at scrape time; request
histograms are observed when a request closes; structured requests are counted when the route
checks their grammar (observe_structured).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from appliance.server.records import STRUCTURED_KINDS, RequestRecord
from appliance.server.state import ServerState

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
COMPILE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Grammar compile times: llguidance takes about 1 ms for a JSON schema, a slow library or a
large schema seconds."""


SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": ("Verified drafts (one per request and step).", "num_drafts"),
    "vllm:spec_decode_num_draft_tokens": ("Drafted tokens verified.", "num_draft_tokens"),
    "vllm:spec_decode_num_accepted_tokens": ("Drafted tokens accepted.", "num_accepted_tokens"),
}
"""Speculative decoding's counters (vLLM's names), from the engine's stats()["spec_decode"]."""


def _kv_usage(stats: dict) -> float:
    total = stats.get("kv_blocks_total") or 0
    return (stats.get("kv_blocks_used", 0) / total) if total else 0.0


class _EngineCollector:
    """Gauges/counters straight from each serving engine's snapshot, with vLLM's names and
    label (one series per loaded model when several serve)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def collect(self):
        state = self.state
        labels = ["model_name"]
        served = [(s.model_name, s.core.stats() if s.core else {}) for s in state.serving_states()]

        def family(kind, name: str, doc: str, value):
            metric = kind(name, doc, labels=labels)
            for model, stats in served:
                v = value(stats)
                if v is not None:
                    metric.add_metric([model], v)
            return metric

        gauges = {
            "vllm:num_requests_running": ("Requests running on the engine.", "num_running"),
            "vllm:num_requests_waiting": ("Requests waiting to be scheduled.", "num_waiting"),
        }
        for name, (doc, key) in gauges.items():
            yield family(GaugeMetricFamily, name, doc, lambda st, k=key: st.get(k, 0))
        for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            doc = "KV-cache usage; 1 means 100 percent."
            yield family(GaugeMetricFamily, name, doc, _kv_usage)
        counters = {
            "vllm:num_preemptions": ("Preemptions by the scheduler.", "num_preemptions_total"),
            "vllm:prompt_tokens": ("Prefill tokens processed.", "prompt_tokens_total"),
            "vllm:generation_tokens": ("Tokens generated.", "generation_tokens_total"),
            "vllm:prefix_cache_queries": (
                "Prompt tokens looked up in the prefix cache (at first admission; tokens "
                "recomputed after a preemption are not counted).",
                "prefix_cache_queries_total",
            ),
            "vllm:prefix_cache_hits": (
                "Prompt tokens found in the prefix cache, of those looked up.",
                "prefix_cache_hits_total",
            ),
        }
        for name, (doc, key) in counters.items():
            yield family(CounterMetricFamily, name, doc, lambda st, k=key: st.get(k, 0))
        if any(st.get("spec_decode") is not None for _, st in served):  # None: it is off
            for name, (doc, key) in SPEC_COUNTERS.items():
                yield family(
                    CounterMetricFamily,
                    name,
                    doc,
                    lambda st, k=key: st["spec_decode"][k] if st.get("spec_decode") else None,
                )
        if any(st.get("compiles_after_warmup") is not None for _, st in served):
            yield family(  # None: this engine cannot count them (no Triton)
                CounterMetricFamily,
                "appliance:triton_compiles_after_warmup",
                "Triton kernel variants built after the engine's warm-up (each one stalls "
                "the steps that wait on it).",
                lambda st: st.get("compiles_after_warmup"),
            )
        g = GaugeMetricFamily(
            "appliance:requests_in_flight", "HTTP requests admitted.", labels=labels
        )
        for s in state.serving_states():
            g.add_metric([s.model_name], len(s.inflight))
        yield g


class Metrics:
    """The app's Prometheus registry and its request-level instruments."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(state))
        labels = ["model_name"]
        r = self.registry

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.tpot = hist(
            "vllm:time_per_output_token_seconds", "Time per output token.", TPOT_BUCKETS
        )
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency.", TPOT_BUCKETS)
        self._itl_child = None  # (model name, its labelled histogram): once per token is hot
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end latency.", E2E_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Time waiting to run.", E2E_BUCKETS)
        self.success = Counter(
            "vllm:request_success", "Finished requests.", labels + ["finished_reason"], registry=r
        )
        self.rejected = Counter(
            "appliance:requests_rejected", "Requests refused with 429.", labels, registry=r
        )
        self.failed = Counter(
            "appliance:requests_failed",
            "Requests ended by an error.",
            labels + ["reason"],
            registry=r,
        )
        self.structured = Counter(
            "appliance:structured_requests",
            "Requests whose output a grammar holds, by kind (tool_call: a forced tool call).",
            labels + ["kind"],
            registry=r,
        )
        self.grammar_compile = hist(
            "appliance:grammar_compile_seconds",
            "The front end's compile of a structured request's grammar.",
            COMPILE_BUCKETS,
        )

    def observe_structured(
        self, kind: str, compile_s: float | None, model: str | None = None
    ) -> None:
        """Count one structured request of `kind` (one of STRUCTURED_KINDS; "tool_call" for a
        forced tool call) for `model` (None: the server's) and observe its grammar compile time
        (None: none was measured).

        Counted at call time, not at close: whatever becomes of the request afterwards (an
        error, a timeout, a cancel), it is counted once. Call it once per request, after its
        grammar check. An unknown kind is a ValueError (each label value is a new series).
        """
        if kind not in STRUCTURED_KINDS:
            raise ValueError(
                f"structured kind {kind!r} is not one of {', '.join(STRUCTURED_KINDS)}"
            )
        model = model or self.state.model_name
        self.structured.labels(model, kind).inc()
        if compile_s is not None:
            self.grammar_compile.labels(model).observe(compile_s)

    def observe_itl(self, seconds: float, count: int = 1, model: str | None = None) -> None:
        """`count` tokens of `model` (None: the server's) that arrived `seconds` apart each
        (one call per delivery)."""
        model = model or self.state.model_name
        if self._itl_child is None or self._itl_child[0] != model:
            self._itl_child = (model, self.itl.labels(model))  # labels() costs ~7 us a call
        observe = self._itl_child[1].observe
        for _ in range(count):
            observe(seconds)

    def request_closed(self, record: RequestRecord) -> None:
        model = record.model
        if record.status != "finished":
            reason = (record.error or record.status).split(":", 1)[0]
            self.failed.labels(model, reason if record.status == "timeout" else record.status).inc()
            return
        if record.ttft_s is not None:
            self.ttft.labels(model).observe(record.ttft_s)
        if record.e2e_s is not None:
            self.e2e.labels(model).observe(record.e2e_s)
        for c in record.choices:
            if c.tpot_s is not None:
                self.tpot.labels(model).observe(c.tpot_s)
            if c.queue_s is not None:
                self.queue.labels(model).observe(c.queue_s)
            self.success.labels(model, c.finish_reason or "abort").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
