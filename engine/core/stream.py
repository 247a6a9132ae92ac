"""RequestStream: one request's outputs, delivered on the event loop that submitted it."""

from __future__ import annotations

import asyncio

from engine.scheduling.request import RequestOutput


class EngineDeadError(RuntimeError):
    """The engine core failed or was shut down; no request can make progress."""


class RequestStream:
    """Outputs are cumulative (token ids and text so far), so a consumer that falls behind
    simply sees the latest output: a slow client never makes the engine wait or buffer
    without bound."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.finished = False
        """True once the final output (or an error) has been handed to this stream."""
        self._latest: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._consumed_final = False

    def put(self, output: RequestOutput) -> None:
        self._latest = output
        if output.finished:
            self.finished = True
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self.finished = True
        self._ready.set()

    async def next(self) -> RequestOutput:
        """The newest output not yet seen; raises StopAsyncIteration after the final one."""
        while True:
            if self._latest is not None:
                output, self._latest = self._latest, None
                self._consumed_final = output.finished
                return output
            if self._error is not None:
                error, self._error = self._error, None
                self._consumed_final = True
                raise error
            if self._consumed_final:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        return await self.next()
