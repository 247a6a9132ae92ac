"""StatsSource: the dashboard's only link to a server: the public stats API over HTTP
(`/v1/stats/stream` as Server-Sent Events, `/v1/requests/{id}` for traces), with aiohttp."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp

from tui.sse import events

STREAM_PATH = "/v1/stats/stream"
TRACE_PATH = "/v1/requests/{id}"


class SourceError(Exception):
    """The server answered, but not with what the dashboard needs (HTTP error, bad body)."""


class StatsSource:
    """Reads one appliance's stats. `stream()` ends or raises when the link breaks; the
    caller decides when to reconnect."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        read_timeout_s: float = 5.0,
        verify_tls: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.verify_tls = verify_tls
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.read_timeout_s = read_timeout_s
        """A stream silent this long counts as broken (the server sends ~4 documents/s)."""
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=None, connect=3.0, sock_read=self.read_timeout_s)
            connector = aiohttp.TCPConnector(ssl=self.verify_tls)
            self._session = aiohttp.ClientSession(
                headers=self.headers, timeout=timeout, connector=connector
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def stream(self) -> AsyncIterator[dict]:
        """Each stats document as the server sends it."""
        async with self._client().get(self.url + STREAM_PATH) as resp:
            await _check(resp)
            async for data in events(resp.content):
                doc = _parse(data)
                if doc is not None:
                    yield doc

    async def trace(self, request_id: str) -> dict:
        """The request's trace; SourceError when the server no longer knows it."""
        async with self._client().get(self.url + TRACE_PATH.format(id=request_id)) as resp:
            await _check(resp)
            return await resp.json()


async def _check(resp: aiohttp.ClientResponse) -> None:
    if resp.status == 200:
        return
    message = f"HTTP {resp.status}"
    try:
        message += ": " + (await resp.json())["error"]["message"]
    except (aiohttp.ContentTypeError, json.JSONDecodeError, KeyError, TypeError):
        pass
    raise SourceError(message)


def _parse(payload: str) -> dict | None:
    """A stats document, or None for data that is not a JSON object (skipped, not fatal)."""
    try:
        doc = json.loads(payload)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
