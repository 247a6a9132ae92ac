"""A server's start as a user meets it: it listens before the engine loads, /health says what
the engine is doing (converting, loading weights, warming up) and every other route answers
503 "loading" in the OpenAI envelope with Retry-After; a load that fails says why on /health
and ends `appliance serve` with 1, or 2 for a configuration the engine refused. The first run
on a fresh cache is checked end to end."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from appliance.serve import serve
from appliance.server import create_app
from appliance.settings import ServeSettings
from engine.startup.phases import phase_words
from tests.support.fake_server import (
    REFUSAL,
    BrokenLoader,
    PhasedLoader,
    RefusingLoader,
    wait_until_served,
)
from tests.support.serve_process import wait_for_url

CONVERTING = phase_words("convert")
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def health_until(get, wanted: dict, timeout_s: float = 30.0) -> dict:
    """Poll GET /health (through `get`) until its body holds every item of `wanted`."""
    deadline = time.monotonic() + timeout_s
    body: dict = {}
    while time.monotonic() < deadline:
        body = await get()
        if wanted.items() <= body.items():
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"/health never said {wanted}; last {body}")


async def test_health_says_what_the_engine_does_and_routes_answer_503_loading(tmp_path):
    release = tmp_path / "release"
    app = create_app(ServeSettings(warmup=False), loader=PhasedLoader(str(release)))
    async with TestClient(TestServer(app)) as client:

        async def get() -> dict:
            r = await client.get("/health")
            assert r.status == 503 or (await r.json())["status"] == "ok"
            return await r.json()

        body = await health_until(get, {"status": "loading", "phase": CONVERTING})
        assert body == {"status": "loading", "phase": CONVERTING}
        for method, path, json in (
            ("GET", "/v1/models", None),
            ("POST", "/v1/chat/completions", CHAT),
            ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 4}),
            ("POST", "/tokenize", {"prompt": "hi"}),
        ):
            r = await client.request(method, path, json=json)
            error = (await r.json())["error"]
            assert r.status == 503 and r.headers["Retry-After"] == "5", path
            assert error["code"] == "loading" and error["type"] == "service_unavailable"
            assert error["message"].startswith("the model is loading (converting the GGUF")
        release.touch()
        await wait_until_served(client)
        r = await client.get("/health")
        assert r.status == 200 and await r.json() == {"status": "ok"}
        assert (await client.get("/v1/models")).status == 200


async def test_a_failed_load_says_why_on_health_and_to_requests():
    app = create_app(ServeSettings(warmup=False), loader=BrokenLoader())
    async with TestClient(TestServer(app)) as client:

        async def get() -> dict:
            return await (await client.get("/health")).json()

        body = await health_until(get, {"status": "error"})
        assert body == {"status": "error", "error": "FileNotFoundError: no model at /nowhere"}
        r = await client.post("/v1/chat/completions", json=CHAT)
        error = (await r.json())["error"]
        assert r.status == 503 and error["code"] == "engine_failed"
        assert "no model at /nowhere" in error["message"]
        assert (await client.get("/health/live")).status == 503


async def test_a_refused_configuration_exits_2_saying_it_once(capsys):
    start = time.monotonic()
    code = await asyncio.wait_for(serve(ServeSettings(port=0), None, RefusingLoader()), 30)
    assert code == 2 and time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert err.count(REFUSAL) == 1 and f"appliance serve: {REFUSAL}" in err
    assert "failed to start" not in err and "Traceback" not in err


async def test_serve_listens_before_the_engine_loads_and_stops_while_loading(tmp_path, capsys):
    release = tmp_path / "release"
    task = asyncio.create_task(serve(ServeSettings(port=0), None, PhasedLoader(str(release))))
    url = await listening_url(capsys, task)
    async with aiohttp.ClientSession() as session:

        async def get() -> dict:
            async with session.get(f"{url}/health") as r:
                return await r.json()

        await health_until(get, {"status": "loading", "phase": CONVERTING})
        release.touch()
        served = await wait_for_url(capsys, task)
        assert served == url
        async with session.get(f"{url}/health") as r:
            assert r.status == 200
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(task, 10) == 0
    # stopped while the engine loads: the load is abandoned, nothing waits for it
    task = asyncio.create_task(serve(ServeSettings(port=0), None, PhasedLoader("/nowhere")))
    await listening_url(capsys, task)
    await asyncio.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(task, 10) == 0


async def listening_url(capsys, task, timeout_s: float = 20.0) -> str:
    """The URL of the line serve() prints on stderr once it listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(r"listening on (https?://\S+);", capsys.readouterr().err)
        if match:
            return match.group(1)
        assert not task.done(), task.result()
        await asyncio.sleep(0.02)
    raise AssertionError("no listening line")


def test_first_run_answers_health_while_it_converts_the_embedded_model(tmp_path):
    """`appliance serve` on a fresh cache: the embedded GGUF converts (about 20 s on 2 CPU
    cores) and the server answers meanwhile; a SIGTERM stops it at once."""
    env = {**os.environ, "APPLIANCE_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "appliance", "serve", "--device", "cpu", "--port", "0"]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            match = re.search(r"listening on (http://\S+);", proc.stderr.readline())
            url = match.group(1) if match else None
        assert url is not None, "no listening line"
        body = asyncio.run(_poll_health(url, {"phase": CONVERTING}))
        assert body == {"status": "loading", "phase": CONVERTING}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait(10)


async def _poll_health(url: str, wanted: dict) -> dict:
    async with aiohttp.ClientSession() as session:

        async def get() -> dict:
            async with session.get(f"{url}/health") as r:
                assert r.status == 503
                return await r.json()

        return await health_until(get, wanted, 60)
