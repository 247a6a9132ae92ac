"""Graceful drain in-process: in-flight requests finish, new ones get 503, and requests cut by
the drain timeout end with an error (an error event for streams), never a silent close."""

from __future__ import annotations

import asyncio
import json

from appliance.server.app_keys import STATE
from tests.support.fake_engine import STALL_MARK, FakeEngine
from tests.support.fake_server import fake_client

COMPLETIONS = "/v1/completions"


async def test_drain_lets_in_flight_requests_finish_and_refuses_new_ones():
    async with fake_client(FakeEngine(step_time=0.01)) as client:
        state = client.app[STATE]
        body = {"prompt": "w1", "max_tokens": 30}
        streamed = asyncio.create_task(client.post(COMPLETIONS, json={**body, "stream": True}))
        plain = asyncio.create_task(client.post(COMPLETIONS, json=body))
        await asyncio.sleep(0.05)
        drain = asyncio.create_task(state.drain(10.0))
        await asyncio.sleep(0)
        r = await client.post(COMPLETIONS, json=body)
        assert r.status == 503
        assert (await r.json())["error"]["code"] == "draining"
        health = await client.get("/health")
        assert health.status == 503 and (await health.json())["status"] == "draining"
        text = await (await streamed).text()
        assert text.rstrip().endswith("data: [DONE]")
        assert '"finish_reason":"length"' in text
        assert (await (await plain).json())["usage"]["completion_tokens"] == 30
        assert await drain is True


async def test_drain_timeout_ends_streams_with_an_error_event():
    async with fake_client(FakeEngine()) as client:
        state = client.app[STATE]
        body = {"prompt": f"w{STALL_MARK} w1", "max_tokens": 50}
        streamed = await client.post(COMPLETIONS, json={**body, "stream": True})
        plain = asyncio.create_task(client.post(COMPLETIONS, json=body))
        await asyncio.sleep(0.05)
        assert await state.drain(0.2) is False
        events = [x for x in (await streamed.text()).split("\n") if x.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][len("data: ") :])["error"]
        assert error["code"] == "drain_timeout" and "shut down" in error["message"]
        r = await plain
        assert r.status == 503 and (await r.json())["error"]["code"] == "drain_timeout"
        stats = await (await client.get("/v1/stats")).json()
        assert stats["engine"]["kv_blocks_used"] == 0 and stats["requests_in_flight"] == 0


async def test_a_second_signal_cuts_requests_saying_so():
    """The drain's own limit is far off: a second Ctrl-C (the `force` event) cuts the requests,
    and they are told it was that signal, not the drain timeout."""
    async with fake_client(FakeEngine()) as client:
        state = client.app[STATE]
        body = {"prompt": f"w{STALL_MARK} w1", "max_tokens": 50}
        streamed = await client.post(COMPLETIONS, json={**body, "stream": True})
        plain = asyncio.create_task(client.post(COMPLETIONS, json=body))
        await asyncio.sleep(0.05)
        force = asyncio.Event()
        drain = asyncio.create_task(state.drain(30.0, force))
        await asyncio.sleep(0.05)
        force.set()
        assert await asyncio.wait_for(drain, 5) is False
        events = [x for x in (await streamed.text()).split("\n") if x.startswith("data: ")]
        error = json.loads(events[-2][len("data: ") :])["error"]
        assert error["code"] == "shutdown_signal" and "cut by a second signal" in error["message"]
        assert "drain timeout" not in error["message"]
        r = await plain
        assert r.status == 503 and (await r.json())["error"]["code"] == "shutdown_signal"
