"""serve(): the process life cycle on a fake engine: HTTPS, the URL line, SIGTERM drain -> 0
(/health/ready says draining meanwhile), and a failed engine load -> exit 1."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import signal
import ssl
import subprocess
from functools import partial

import aiohttp
import pytest

from appliance.listener import make_ssl_context
from appliance.serve import serve
from appliance.settings import ServeSettings
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import BrokenLoader
from tests.support.serve_process import wait_for_url


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_https_then_sigterm_drains_and_returns_0(tmp_path, capsys):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    settings = ServeSettings(port=0, ssl_certfile=str(cert), ssl_keyfile=str(key), warmup=True)
    loader = partial(FakeEngine, step_time=0.01)
    task = asyncio.create_task(serve(settings, make_ssl_context(settings), loader))
    url = await wait_for_url(capsys, task)
    assert url.startswith("https://127.0.0.1:")
    client_ctx = ssl.create_default_context(cafile=str(cert))
    client_ctx.check_hostname = False
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "w1", "max_tokens": 40}
        inflight = asyncio.create_task(
            session.post(f"{url}/v1/completions", json=body, ssl=client_ctx)
        )
        await asyncio.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)
        refused = await session.post(f"{url}/v1/completions", json=body, ssl=client_ctx)
        assert refused.status == 503
        ready = await session.get(f"{url}/health/ready", ssl=client_ctx)
        assert ready.status == 503 and (await ready.json())["reason"] == "draining"
        assert (await session.get(f"{url}/health/live", ssl=client_ctx)).status == 200
        done = await inflight
        assert done.status == 200
        assert (await done.json())["choices"][0]["finish_reason"] == "length"
    assert await asyncio.wait_for(task, 10) == 0


async def test_failed_engine_load_exits_1(capsys):
    code = await asyncio.wait_for(serve(ServeSettings(port=0), None, BrokenLoader()), 30)
    assert code == 1
    assert "no model at /nowhere" in capsys.readouterr().err


async def test_engine_process_death_fails_streams_and_exits_1(capsys, caplog):
    """The engine core is killed mid-stream: the open stream ends with an error event, a new
    request gets a 503 at once, and serve() returns 1 for a supervisor to restart it."""
    loader = partial(FakeEngine, step_time=0.01)
    task = asyncio.create_task(serve(ServeSettings(port=0), None, loader))
    url = await wait_for_url(capsys, task)
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "w1", "max_tokens": 100, "stream": True}
        stream = await session.post(f"{url}/v1/completions", json=body)
        assert (await stream.content.readuntil(b"\n\n")).startswith(b"data: ")
        core = next(p for p in multiprocessing.active_children() if p.name == "engine-core")
        core.kill()
        rest = await asyncio.wait_for(stream.text(), 5)
        assert '"error"' in rest and rest.rstrip().endswith("data: [DONE]")
        refused = await session.post(f"{url}/v1/completions", json={"prompt": "w1"})
        assert refused.status == 503
        live = await session.get(f"{url}/health/live")
        assert live.status == 503 and (await live.json())["reason"] == "engine core gone"
    assert await asyncio.wait_for(task, 10) == 1
    assert "exiting so that it can be restarted" in caplog.text
