"""The fake engine's loaders and the server around it: loaders that are slow, pass through
start-up phases, fail or are refused while planning (each runs in the engine core process);
an aiohttp client on `create_app` served as `appliance serve` serves it; SSE parsing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass

from tests.support.fake_engine import FakeEngine


@dataclass(frozen=True)
class SlowLoader:
    """Builds a FakeEngine in the core process once the file `release` exists (at most 10 s):
    a model that takes as long to load as the test wants."""

    release: str

    def __call__(self) -> FakeEngine:
        deadline = time.monotonic() + 10
        while not os.path.exists(self.release) and time.monotonic() < deadline:
            time.sleep(0.01)
        return FakeEngine()


@dataclass(frozen=True)
class PhasedLoader:
    """Builds a FakeEngine in the core process through LLMEngine's start-up phases: it reports
    converting a GGUF file until the file `release` exists (at most 10 s), then loading
    weights."""

    release: str

    def __call__(self, on_phase) -> FakeEngine:
        on_phase("convert")
        deadline = time.monotonic() + 10
        while not os.path.exists(self.release) and time.monotonic() < deadline:
            time.sleep(0.01)
        on_phase("load")
        return FakeEngine()


class BrokenLoader:
    """A model that fails to load, in the core process."""

    def __call__(self) -> FakeEngine:
        raise FileNotFoundError("no model at /nowhere")


def app_server(app):
    """aiohttp's TestServer on the runner `appliance serve` listens with (its connections
    answer what the HTTP parser refuses in the error envelope)."""
    from aiohttp.test_utils import TestServer

    from appliance.server.app_runner import AppRunner

    class AppServer(TestServer):
        async def _make_runner(self, **kwargs):
            return AppRunner(self.app, **kwargs)

    return AppServer(app)


REFUSAL = "max_num_seqs=4096 needs 9 GiB of KV cache; the pool holds 1 GiB: set max_num_seqs to 448"


class RefusingLoader:
    """Settings the engine refuses while it plans, before any weight loads (a PlanError)."""

    def __call__(self, on_phase) -> FakeEngine:
        on_phase("plan")
        raise ValueError(REFUSAL)


@contextlib.asynccontextmanager
async def fake_client(engine: FakeEngine | None = None, **settings):
    """An aiohttp TestClient on create_app(ServeSettings(**settings), engine or FakeEngine()),
    served as `appliance serve` serves it (app_server), once its engine core process serves:
    the engine is pickled into that process, so changing it afterwards changes nothing there
    (steer it with prompt markers instead)."""
    from aiohttp.test_utils import TestClient

    from appliance.server import create_app
    from appliance.settings import ServeSettings

    engine = engine or FakeEngine()
    app = create_app(ServeSettings(**{"warmup": False, **settings}), engine)
    async with TestClient(app_server(app)) as client:
        await wait_until_served(client)
        yield client


async def wait_until_served(client, timeout_s: float = 60.0) -> None:
    """Wait for /health to leave "loading"; fails when the engine did not start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = await client.get("/health")
        body = await r.json()
        if body["status"] != "loading":
            assert r.status == 200, f"the engine did not start: {body}"
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine did not start within {timeout_s:g} s")


def sse_events(text: str) -> list:
    """The JSON events of an SSE body that ends in `data: [DONE]`."""
    events = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]
