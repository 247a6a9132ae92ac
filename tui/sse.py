"""Server-Sent Events for the clients of a server (the dashboard, the load generator): one
incremental parser of text/event-stream bytes, and the event data of an aiohttp response.

Imports nothing from appliance/ or engine/, so both sides of that rule can use it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

DONE = "[DONE]"
"""The data of the event that ends an OpenAI stream."""


class SSEParser:
    """Feed it bytes as they arrive, split anywhere; it returns the data of each event they
    complete. As the format says: a line ends with LF, CRLF or CR; a line starting with ':' is a
    comment; the "data" lines of an event (one space after the colon dropped) join with newlines;
    a blank line ends the event; an event without data is no event; other fields (event, id,
    retry) are ignored, and so is an unfinished event when the stream ends."""

    def __init__(self) -> None:
        self._rest = b""
        """The bytes after the last complete line."""
        self._data: list[str] = []
        """The data lines of the event being read."""

    def feed(self, chunk: bytes) -> list[str]:
        buffer = self._rest + chunk
        held = b""
        if b"\r" in buffer:
            if buffer.endswith(b"\r"):  # maybe the first half of a CRLF: wait for the next byte
                buffer, held = buffer[:-1], b"\r"
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._rest = lines.pop() + held
        events = []
        for line in lines:
            if not line:
                if self._data:
                    data = "\n".join(self._data)
                    self._data = []
                    if data:
                        events.append(data)
            elif line.startswith(b"data"):
                name, _, value = line.partition(b":")
                if name == b"data":
                    if value.startswith(b" "):
                        value = value[1:]
                    self._data.append(value.decode("utf-8", "replace"))
        return events


class _Body(Protocol):
    def iter_any(self) -> AsyncIterator[bytes]: ...


async def events(body: _Body) -> AsyncIterator[str]:
    """The data of each event of a response body (aiohttp's `response.content`), as it comes,
    until a [DONE] event or the end of the body."""
    parser = SSEParser()
    async for chunk in body.iter_any():
        for data in parser.feed(chunk):
            if data == DONE:
                return
            yield data
