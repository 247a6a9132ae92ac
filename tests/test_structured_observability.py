"""What the server shows of structured and tool requests: the record's grammar kind, tools flag
and compile time in /v1/stats, /v1/requests/{id} and the request log; the engine's grammar
summary per choice in the trace."""

from __future__ import annotations

import json

import pytest

from appliance.server.keys import TRACKER
from appliance.server.records import ChoiceRecord, RequestRecord
from engine.request import RequestMetrics, RequestOutput, TraceEvent
from tests.support.fake_engine import FakeEngine, fake_client

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
