"""/health/live and /health/ready: what a Kubernetes-style probe sees while the engine loads,
warms up, serves, drains and after its core died; /health keeps its own answers."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from aiohttp.test_utils import TestClient, TestServer

from appliance.server import create_app
from appliance.server.app_keys import STATE
from appliance.settings import ServeSettings
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import SlowLoader, fake_client, wait_until_served
from tests.support.waiting import wait_until

COMPLETIONS = "/v1/completions"


async def probe(client, path: str) -> tuple[int, str | None]:
    r = await client.get(path)
    body = await r.json()
    assert body["status"] == ("ok" if r.status == 200 else "unavailable"), body
    return r.status, body.get("reason")


async def wait_for_reason(client, path: str, reason: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await probe(client, path))[1] == reason:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never answered {reason!r}")


async def test_ready_is_503_while_loading_and_200_once_served(tmp_path):
    release = tmp_path / "release"
    app = create_app(ServeSettings(warmup=False), loader=SlowLoader(str(release)))
    async with TestClient(TestServer(app)) as client:
        assert await probe(client, "/health/ready") == (503, "loading")
        assert await probe(client, "/health/live") == (200, None)
        r = await client.get("/health")  # its own words for the same phase
        assert r.status == 503 and (await r.json()) == {
            "status": "loading",
            "phase": "loading the model",
        }
        release.touch()
        await wait_until_served(client)
        assert await probe(client, "/health/ready") == (200, None)
        assert await probe(client, "/health/live") == (200, None)


async def test_ready_says_warming_up_while_the_core_warms_up():
    # Warm-up runs two fake steps of 0.4 s each in the core, after the engine is built.
    app = create_app(ServeSettings(warmup=True), FakeEngine(step_time=0.4))
    async with TestClient(TestServer(app)) as client:
        await wait_for_reason(client, "/health/ready", "warming up")
        assert await probe(client, "/health/live") == (200, None)
        await wait_until_served(client)
        assert await probe(client, "/health/ready") == (200, None)


async def test_ready_is_503_draining_while_live_stays_200():
    async with fake_client(FakeEngine(step_time=0.01)) as client:
        state = client.app[STATE]
        inflight = asyncio.create_task(
            client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 30})
        )
        await wait_until(lambda: state.num_inflight_seqs == 1, what="the request admitted")
        drain = asyncio.create_task(state.drain(10.0))
        await asyncio.sleep(0)
        assert await probe(client, "/health/ready") == (503, "draining")
        assert await probe(client, "/health/live") == (200, None)
        assert (await inflight).status == 200
        assert await drain is True


async def test_a_dead_core_fails_both_probes():
    async with fake_client() as client:
        state = client.app[STATE]
        os.kill(state.process.process.pid, signal.SIGKILL)
        await wait_for_reason(client, "/health/live", "engine core gone")
        assert await probe(client, "/health/ready") == (503, "engine core gone")


async def test_probes_need_no_api_key():
    async with fake_client(api_key=["ops:sk-probe-key"]) as client:
        assert (await client.get("/v1/models")).status == 401
        assert await probe(client, "/health/live") == (200, None)
        assert await probe(client, "/health/ready") == (200, None)
