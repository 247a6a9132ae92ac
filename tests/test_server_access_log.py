"""The access log has one line per request, also for a client that disconnects before its answer
ended: status 499 "client disconnected", with the request id and the path."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import pytest

from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client

COMPLETIONS = "/v1/completions"


async def access_lines(caplog, request_id: str, timeout_s: float = 5.0) -> list[str]:
    """The access-log lines for `request_id`, once there is one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = [
            r.getMessage()
            for r in caplog.records
            if r.name == "appliance.server" and r.getMessage().startswith(f"{request_id} ")
        ]
        if lines:
            return lines
        await asyncio.sleep(0.02)
    raise AssertionError(f"no access-log line for {request_id}")


async def test_a_finished_request_logs_its_status(caplog):
    caplog.set_level(logging.INFO, logger="appliance.server")
    async with fake_client() as client:
        body = {"prompt": "w1", "max_tokens": 2}
        r = await client.post(COMPLETIONS, json=body, headers={"X-Request-Id": "done-1"})
        assert r.status == 200
        (line,) = await access_lines(caplog, "done-1")
    assert line.startswith(f"done-1 POST {COMPLETIONS} 200 ") and "disconnected" not in line


async def test_a_client_gone_mid_stream_is_logged_499(caplog):
    caplog.set_level(logging.INFO, logger="appliance.server")
    async with fake_client(FakeEngine(step_time=0.01)) as client:
        body = {"prompt": "w1", "max_tokens": 100, "stream": True}
        r = await client.post(COMPLETIONS, json=body, headers={"X-Request-Id": "gone-stream"})
        await r.content.readuntil(b"\n\n")
        r.close()
        (line,) = await access_lines(caplog, "gone-stream")
    assert line.startswith(f"gone-stream POST {COMPLETIONS} 499 ")
    assert line.endswith("client disconnected")


async def test_a_client_gone_before_a_plain_answer_is_logged_499(caplog):
    caplog.set_level(logging.INFO, logger="appliance.server")
    async with fake_client(FakeEngine(step_time=0.01)) as client:
        with pytest.raises(asyncio.TimeoutError):
            await client.post(
                COMPLETIONS,
                json={"prompt": "w1", "max_tokens": 100},
                headers={"X-Request-Id": "gone-plain"},
                timeout=aiohttp.ClientTimeout(total=0.1),
            )
        (line,) = await access_lines(caplog, "gone-plain")
    assert line.startswith(f"gone-plain POST {COMPLETIONS} 499 ")
    assert line.endswith("client disconnected")
