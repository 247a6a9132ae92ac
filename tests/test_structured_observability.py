"""What the server shows of structured and tool requests: the record's grammar kind, tools flag
and compile time in /v1/stats, /v1/requests/{id} and the request log; the engine's grammar
summary per choice in the trace; the structured-request counter and the compile-time histogram
in /metrics."""

from __future__ import annotations

import json

import pytest

from appliance.server.app_keys import METRICS, TRACKER
from appliance.server.records import STRUCTURED_KINDS, ChoiceRecord, RequestRecord
from engine.scheduling.request import RequestMetrics, RequestOutput, TraceEvent
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client

MARKED = {
    "req-json": ("json_schema", False, 0.0012),
    "req-tool": ("tool_call", True, 0.0031),
    "req-auto": (None, True, None),
}
"""Request id -> (structured, tools, grammar_compile_s), as the routes set them."""


def mark_records(client) -> None:
    """Set the fields on each new record the way the routes do, right after it is made."""
    tracker = client.app[TRACKER]
    add = tracker.add

    def add_marked(record: RequestRecord) -> None:
        if record.request_id in MARKED:
            record.structured, record.tools, record.grammar_compile_s = MARKED[record.request_id]
        add(record)

    tracker.add = add_marked


async def _post(client, rid: str) -> None:
    r = await client.post(
        "/v1/completions",
        json={"prompt": "w1 w2", "max_tokens": 3},
        headers={"X-Request-Id": rid},
    )
    assert r.status == 200


async def test_record_fields_reach_stats_trace_and_request_log(tmp_path):
    path = tmp_path / "requests.jsonl"
    async with fake_client(FakeEngine(), log_requests=str(path)) as client:
        mark_records(client)
        for rid in (*MARKED, "req-plain"):
            await _post(client, rid)
        stats = await (await client.get("/v1/stats")).json()
        rows = {r["id"]: r for r in stats["requests"]}
        traces = {t["id"]: t for t in stats["traces"]}
        for rid, (kind, tools, compile_s) in {**MARKED, "req-plain": (None, False, None)}.items():
            got = (rows[rid]["structured"], rows[rid]["tools"], rows[rid]["grammar_compile_s"])
            assert got == (kind, tools, compile_s), rid
            trace = await (await client.get(f"/v1/requests/{rid}")).json()
            assert (trace["structured"], trace["tools"], trace["grammar_compile_s"]) == got
            assert traces[rid]["structured"] == kind
            assert trace["choices"][0]["grammar"] is None  # the fake engine runs no grammar
    lines = {x["id"]: x for x in map(json.loads, path.read_text().splitlines())}
    assert lines["req-json"]["structured"] == "json_schema"
    assert lines["req-json"]["grammar_compile_s"] == 0.0012
    assert lines["req-tool"]["structured"] == "tool_call" and lines["req-tool"]["tools"] is True
    assert lines["req-auto"]["structured"] is None and lines["req-auto"]["tools"] is True
    assert lines["req-plain"]["structured"] is None and lines["req-plain"]["tools"] is False


def test_trace_carries_the_engines_grammar_summary_per_choice():
    """The engine's "grammar" event (compile and mask time per step) is each choice's
    `grammar` in the trace, and stays in the time-ordered event list."""
    summary = {
        "kind": "json_schema",
        "compile_ms": 1.2,
        "mask_steps": 40,
        "mask_ms_mean": 0.05,
        "mask_ms_max": 0.3,
        "tokens_accepted": 40,
    }
    record = RequestRecord("r1", "chat", "m", received_at=100.0, structured="json_schema")
    record.grammar_compile_s = 0.0011
    for index, detail in ((0, summary), (1, None)):
        choice = ChoiceRecord(index, f"r1-{index}", 0, 5)
        trace = [TraceEvent(100.001, "arrived"), TraceEvent(100.002, "grammar_compiling")]
        trace += [TraceEvent(100.5, "grammar", detail)] if detail else []
        trace += [TraceEvent(100.5, "finished", {"reason": "stop"})]
        output = RequestOutput(
            f"r1-{index}", [1] * 5, [7] * 40, "", True, "stop", RequestMetrics(100.0), trace=trace
        )
        choice.update(output, now=100.5)
        record.choices.append(choice)
    record.close("finished", 200)
    trace = record.trace()
    assert [c["grammar"] for c in trace["choices"]] == [summary, None]
    assert trace["structured"] == "json_schema" and trace["grammar_compile_s"] == 0.0011
    grammar = [e for e in trace["events"] if e["event"] == "grammar"]
    assert len(grammar) == 1 and grammar[0]["detail"] == summary
    assert grammar[0]["choice"] == 0 and grammar[0]["t_ms"] == pytest.approx(500.0)


def _sample(text: str, name: str) -> float | None:
    """The value of the one /metrics line that starts with `name` (labels included)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    assert len(values) <= 1, name
    return values[0] if values else None


async def test_observe_structured_counts_by_kind_and_observes_compile_time():
    async with fake_client() as client:
        metrics = client.app[METRICS]
        text = await (await client.get("/metrics")).text()
        assert "appliance:structured_requests_total{" not in text  # no kind seen yet
        assert "# TYPE appliance:grammar_compile_seconds histogram" in text
        metrics.observe_structured("json_schema", 0.0012)
        metrics.observe_structured("json_schema", 0.004)
        metrics.observe_structured("tool_call", 0.02)
        metrics.observe_structured("regex", None)  # counted; no compile time observed
        text = await (await client.get("/metrics")).text()
    count = 'appliance:structured_requests_total{kind="%s",model_name="fake-model"}'
    counts = {kind: _sample(text, count % kind) for kind in STRUCTURED_KINDS}
    assert counts == {
        "json_schema": 2.0,
        "json_object": None,
        "regex": 1.0,
        "choice": None,
        "grammar": None,
        "tool_call": 1.0,
    }
    hist = "appliance:grammar_compile_seconds"
    label = '{model_name="fake-model"}'
    assert _sample(text, f"{hist}_count{label}") == 3.0
    assert _sample(text, f"{hist}_sum{label}") == pytest.approx(0.0252)
    bucket = hist + '_bucket{le="%s",model_name="fake-model"}'
    assert _sample(text, bucket % "0.001") == 0.0
    assert _sample(text, bucket % "0.0025") == 1.0
    assert _sample(text, bucket % "0.005") == 2.0
    assert _sample(text, bucket % "0.025") == 3.0
    assert _sample(text, bucket % "0.0001") == 0.0 and _sample(text, bucket % "10.0") == 3.0


async def test_observe_structured_refuses_an_unknown_kind():
    async with fake_client() as client:
        with pytest.raises(ValueError, match="'json' is not one of json_schema, json_object"):
            client.app[METRICS].observe_structured("json", 0.001)
