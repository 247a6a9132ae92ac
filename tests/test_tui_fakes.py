"""The dashboard's fakes (tests/support/tui_fakes.py, tui_trace_fakes.py) against the real
server: the fake /v1/stats documents and traces carry the keys the server's have, at the same
places."""

from __future__ import annotations

import asyncio

from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client
from tests.support.tui_fakes import CONFIG, make_doc
from tests.support.tui_trace_fakes import make_trace


def _shape(node: object) -> object:
    """The keys of a document, recursively (lists by their first item)."""
    if isinstance(node, dict):
        return {k: _shape(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_shape(node[0])] if node and isinstance(node[0], dict) else []
    return None


async def test_fake_documents_have_the_servers_shape():
    """The fake's documents carry every key the real /v1/stats has, at the same places."""

    async with fake_client(FakeEngine(step_time=0.05)) as client:
        running = asyncio.ensure_future(
            client.post("/v1/completions", json={"prompt": "w5 w6", "max_tokens": 20})
        )
        for _ in range(100):
            real = await (await client.get("/v1/stats")).json()
            if real["requests"] and real["kv"]["top_requests"]:
                break
            await asyncio.sleep(0.02)
        await running
    real_shape, fake_shape = _shape(real), _shape(make_doc())
    real_shape.pop("traces"), fake_shape.pop("traces")
    real_shape["config"], fake_shape["config"] = set(real_shape["config"]), set(CONFIG)
    # "keys" maps key names to entries: the entries' fields must match, whatever the names; a
    # server without per-key figures sends no section (the dashboard then says so).
    real_keys, fake_keys = real_shape.pop("keys", None), fake_shape.pop("keys")
    if real_keys is not None:
        assert {frozenset(e) for e in real_keys.values()} == {
            frozenset(e) for e in fake_keys.values()
        }
    assert fake_shape == real_shape


async def test_fake_traces_have_the_servers_keys_at_every_level():
    """A fake trace (plain, structured or speculative) has the keys of /v1/requests/{id}, of its
    choices and of its events, and its events are in time order, as the server's are."""
    async with fake_client() as client:
        body = {"prompt": "w5 w6", "max_tokens": 3}
        await client.post("/v1/completions", json=body, headers={"X-Request-Id": "t1"})
        real = await (await client.get("/v1/requests/t1")).json()
    real_event_keys = set().union(*real["events"])
    assert [e["t_ms"] for e in real["events"]] == sorted(e["t_ms"] for e in real["events"])
    fakes = {"plain": make_trace("req-done-e"), "structured": make_trace("req-done-f")}
    fakes["spec"] = make_trace(spec=True)
    for name, fake in fakes.items():
        assert set(fake) == set(real), name
        assert set(fake["choices"][0]) == set(real["choices"][0]), name
        assert set().union(*fake["events"]) == real_event_keys, name
        assert [e["t_ms"] for e in fake["events"]] == sorted(e["t_ms"] for e in fake["events"])
    events = [e["event"] for e in fakes["structured"]["events"]]
    assert events.index("grammar_compiled") < events.index("scheduled")
    assert events.index("grammar") == events.index("finished") - 1


async def test_fake_spec_section_has_the_servers_keys():
    """A speculative fake document's spec_decode and config carry the real server's keys."""
    async with fake_client(FakeEngine(speculative="ngram")) as client:
        await client.post("/v1/completions", json={"prompt": "w1 w2", "max_tokens": 4})
        real = await (await client.get("/v1/stats")).json()
    fake = make_doc(0, spec=True)
    assert set(fake["engine"]["spec_decode"]) == set(real["engine"]["spec_decode"])
    assert fake["config"]["speculative"] == real["config"]["speculative"] == "ngram"
    assert "num_speculative_tokens" in real["config"]
