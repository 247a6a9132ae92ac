"""`serve --api-workers 2`: two front-end processes on one port share one engine core; both
answer, SIGTERM drains both and returns 0, and the engine's figures are the same on each."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from functools import partial

import aiohttp
import pytest

from appliance.serve import serve
from appliance.settings import ServeSettings, SettingsError
from tests.support.fake_engine import FakeEngine
from tests.support.serve_process import wait_for_url


async def pids_answering(url: str, tries: int = 200) -> set[int]:
    """The front-end pids behind the port, one new connection per try."""
    pids: set[int] = set()
    for _ in range(tries):
        async with aiohttp.ClientSession() as session:  # a new connection each time
            stats = await (await session.get(f"{url}/v1/stats")).json()
        pids.add(stats["server"]["pid"])
        if len(pids) == 2:
            break
        await asyncio.sleep(0.01)
    return pids


async def test_two_front_ends_share_the_port_and_the_engine(capsys):
    loader = partial(FakeEngine, step_time=0.005, max_num_seqs=8)
    task = asyncio.create_task(
        serve(ServeSettings(port=0, api_workers=2, warmup=False), None, loader)
    )
    url = await wait_for_url(capsys, task)
    assert await pids_answering(url) == {
        os.getpid(),
        *(p.pid for p in multiprocessing.active_children() if p.name == "api-worker-1"),
    }
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> int:
            async with aiohttp.ClientSession() as own:  # spread over both front ends
                r = await own.post(
                    f"{url}/v1/completions", json={"prompt": f"w{20 + i}", "max_tokens": 5}
                )
                body = await r.json()
                return len(body["choices"][0]["text"].split())

        assert await asyncio.gather(*(one(i) for i in range(24))) == [5] * 24
        stats = await (await session.get(f"{url}/v1/stats")).json()
        assert stats["engine"]["generation_tokens_total"] == 24 * 5  # one engine for both
    workers = [p for p in multiprocessing.active_children() if p.name.startswith("api-worker")]
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(task, 20) == 0
    assert all(p.exitcode == 0 for p in workers)


def test_the_dashboard_runs_one_front_end():
    with pytest.raises(SettingsError, match="--tui runs one front end"):
        ServeSettings(tui=True, api_workers=2)
    with pytest.raises(SettingsError, match="api_workers is too small"):
        ServeSettings(api_workers=0)
