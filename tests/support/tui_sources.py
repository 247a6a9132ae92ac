"""Where the dashboard tests' documents come from: a small aiohttp server that streams them
(and can be stopped and restarted on the same port), and an in-memory source for the
snapshots."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator

from aiohttp import web

from tests.support.tui_trace_fakes import make_trace


class FakeStatsServer:
    """Streams `docs` in order (every `interval` s), then keeps the stream open and idle;
    serves `traces` by id; `stop()` and `start()` simulate a server restart on the same port."""

    def __init__(self, docs: list[dict], interval: float = 0.02, api_key: str | None = None):
        self.docs, self.interval, self.api_key = docs, interval, api_key
        self.traces = {rid: make_trace(rid) for rid in ("req-done-e", "req-done-f")}
        self.port = 0
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/stats/stream", self._stream)
        app.router.add_get("/v1/requests/{rid}", self._trace)
        return app

    def _authorized(self, request: web.Request) -> bool:
        return not self.api_key or request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            body = {
                "error": {"message": "invalid API key", "type": "x", "param": None, "code": None}
            }
            return web.json_response(body, status=401)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = 0
        while True:
            if sent < len(self.docs):
                await resp.write(f"data: {json.dumps(self.docs[sent])}\n\n".encode())
                sent += 1
            await asyncio.sleep(self.interval)

    async def _trace(self, request: web.Request) -> web.Response:
        trace = self.traces.get(request.match_info["rid"])
        if trace is None:
            return web.json_response({"error": {"message": "no recent request"}}, status=404)
        return web.json_response(trace)

    async def start(self) -> None:
        self.runner = web.AppRunner(self._app(), shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


class ReplaySource:
    """An in-memory StatsSource for the snapshots: a fixed URL, fixed documents, then silence."""

    url = "http://appliance.lan:8000"

    def __init__(self, docs: list[dict]) -> None:
        self.docs = docs

    async def stream(self) -> AsyncIterator[dict]:
        for doc in self.docs:
            yield copy.deepcopy(doc)
        await asyncio.Event().wait()

    async def trace(self, request_id: str) -> dict:
        return make_trace(request_id)

    async def close(self) -> None:
        pass
