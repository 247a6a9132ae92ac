"""ModelCounts: each model's request counts and when it was last asked for, and the latency
percentiles of one model's kept records, for /v1/stats' "models" rows and "by_model" sections
when several models serve."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from appliance.server.records import RequestRecord
from tui.models import MODEL_SECTIONS

ENGINE_SECTIONS = MODEL_SECTIONS
"""The /v1/stats keys that describe one engine: at the top level the model used last, and under
"by_model" each loaded model's (the dashboard swaps these when it shows another model)."""


@dataclass
class ModelCounts:
    """One model's requests as the tracker saw them (by the record's model name)."""

    requests_total: int = 0
    """Requests admitted for the model."""
    finished_total: int = 0
    """Of those, requests that finished (served)."""
    rejected_total: int = 0
    """Requests refused with 429 while the model was named."""
    timed_out_total: int = 0
    last_request_at: float | None = None
    """Wall time the model last admitted a request (None: never)."""

    def as_dict(self) -> dict:
        return asdict(self)


def record_latency(
    records: list[RequestRecord], percentiles: Callable[[list[float]], dict]
) -> dict:
    """TTFT, TPOT, end-to-end and queue percentiles over `records` that finished (the kept
    ones; the server-wide windows are not split by model); itl_s is not kept per request."""
    done = [r for r in records if r.status == "finished"]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    e2e = [r.e2e_s for r in done if r.e2e_s is not None]
    tpot = [c.tpot_s for r in done for c in r.choices if c.tpot_s is not None]
    queue = [c.queue_s for r in done for c in r.choices if c.queue_s is not None]
    return {
        "ttft_s": percentiles(ttft),
        "tpot_s": percentiles(tpot),
        "itl_s": percentiles([]),
        "e2e_s": percentiles(e2e),
        "queue_s": percentiles(queue),
    }
