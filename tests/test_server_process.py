"""serve(): the process life cycle on a fake engine: HTTPS, the URL line, SIGTERM drain -> 0,
and a failed engine load -> exit 1."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import ssl
import subprocess

import aiohttp
import pytest

from appliance.serve import make_ssl_context, serve
from appliance.settings import ServeSettings
from tests.support.fake_engine import FakeEngine


async def wait_for_url(capsys, task: asyncio.Task) -> str:
    for _ in range(200):
        match = re.search(r"at (https?://\S+)/v1", capsys.readouterr().out)
        if match:
            return match.group(1)
        assert not task.done(), task.result()
        await asyncio.sleep(0.02)
    raise AssertionError("no URL line")


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
    engine = FakeEngine(step_time=0.01)
    task = asyncio.create_task(serve(settings, make_ssl_context(settings), lambda: engine))
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
        done = await inflight
        assert done.status == 200
        assert (await done.json())["choices"][0]["finish_reason"] == "length"
    assert await asyncio.wait_for(task, 10) == 0


async def test_failed_engine_load_exits_1(capsys):
    def broken():
        raise FileNotFoundError("no model at /nowhere")

    code = await asyncio.wait_for(serve(ServeSettings(port=0), None, broken), 10)
    assert code == 1
    assert "no model at /nowhere" in capsys.readouterr().err
