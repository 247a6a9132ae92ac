"""An appliance server on a scripted FakeEngine, served on a real loopback port from a thread of
its own (the browser tests drive Playwright's sync API, which wants no event loop in the test's
thread)."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from appliance.server import create_app
from appliance.server.app_runner import AppRunner
from appliance.settings import ServeSettings
from tests.support.fake_engine import FakeEngine


@contextmanager
def threaded_server(engine: FakeEngine, timeout_s: float = 60.0, **settings) -> Iterator[str]:
    """Serve create_app(ServeSettings(**settings), engine) on 127.0.0.1; yields its base URL once
    /health answers 200."""
    loop = asyncio.new_event_loop()
    started: list[str] = []
    stop = asyncio.Event()

    async def serve() -> None:
        app = create_app(ServeSettings(**{"warmup": False, **settings}), engine)
        runner = AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        started.append(f"http://127.0.0.1:{port}")
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started, "the server did not bind"
    url = started[0]
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                if resp.status == 200:
                    break
        except OSError:
            time.sleep(0.05)
    else:
        raise AssertionError("the fake engine did not start")
    try:
        yield url
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
