"""AsyncEngine: runs an LLMEngine's step loop in its own thread and streams outputs to asyncio.

The engine thread owns the LLMEngine. Other threads never touch it: they queue commands (add,
abort) that the engine thread applies between steps, and they read a stats snapshot that the
engine thread refreshes after each step. Outputs go back to the event loop that submitted the
request with `loop.call_soon_threadsafe`, one call per loop per step. When there is nothing to
do the thread sleeps on a condition variable; it never spins.

Outputs are cumulative (token ids and text so far), so a consumer that falls behind simply sees
the latest output: a slow client never makes the engine wait or buffer without bound.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from engine.request import RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop failed or was shut down; no request can make progress."""


class RequestStream:
    """One request's outputs, delivered on the event loop that submitted it."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.loop = loop
        self.finished = False
        """True once the final output (or an error) has been handed to this stream."""
        self._latest: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._consumed_final = False

    # Called on self.loop only.
    def _put(self, output: RequestOutput) -> None:
        self._latest = output
        if output.finished:
            self.finished = True
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
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


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    arrival_time: float | None
    stream: RequestStream
    accepted: asyncio.Future


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    """Thread-safe, asyncio-facing wrapper around an LLMEngine (or anything with its API)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._commands: list[_Add | _Abort] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._dead: BaseException | None = None
        self._num_unfinished = 0  # submitted and not yet finished; under _cond
        self._stats: dict = {**engine.stats(), "num_unfinished": 0, "last_step_s": 0.0}

    # --- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort everything still running, stop the thread and wait for it."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    # --- submission (any thread with a running event loop) ---------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> RequestStream:
        """Queue a request and wait until the engine thread accepted it.

        Raises the engine's ValueError (bad prompt, too long, duplicate id) here, before any
        output. Cancelling the caller after this point is the caller's job to turn into abort().
        """
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_id, loop)
        accepted: asyncio.Future = loop.create_future()
        with self._cond:
            if self._dead is not None or self._stopping:
                raise EngineDeadError(f"the engine is not running ({self._dead or 'shut down'})")
            self._commands.append(_Add(request_id, prompt, params, arrival_time, stream, accepted))
            self._num_unfinished += 1
            self._cond.notify()
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return stream

    async def generate(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield cumulative outputs until the request finishes; closing the iterator early
        (client gone, task cancelled) aborts the request in the engine."""
        stream = await self.add_request(request_id, prompt, params, arrival_time)
        try:
            async for output in stream:
                yield output
        finally:
            if not stream.finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Ask the engine thread to abort a request; returns at once, from any thread."""
        with self._cond:
            self._commands.append(_Abort(request_id))
            self._cond.notify()

    def stats(self) -> dict:
        """A snapshot of the engine's counters as of its last step, plus queue bookkeeping."""
        with self._cond:
            return {**self._stats, "num_unfinished": self._num_unfinished}

    # --- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                has_work = self.engine.has_unfinished()
                with self._cond:
                    while not (self._commands or has_work or self._stopping):
                        self._cond.wait()
                    commands, self._commands = self._commands, []
                    stopping = self._stopping
                aborted = self._apply(commands)
                if stopping:
                    for request_id in list(self._streams):
                        self.engine.abort(request_id)
                        aborted.add(request_id)
                if self.engine.has_unfinished() or aborted:
                    start = time.perf_counter()
                    outputs = self.engine.step()
                    self._dispatch(outputs, aborted, time.perf_counter() - start)
                if stopping:
                    break
        except BaseException as exc:  # the loop must never die silently
            logger.exception("engine loop failed")
            self._die(exc)
            return
        self._die(EngineDeadError("the engine was shut down"))

    def _apply(self, commands: list[_Add | _Abort]) -> set[str]:
        aborted: set[str] = set()
        for cmd in commands:
            if isinstance(cmd, _Abort):
                if cmd.request_id in self._streams:
                    self.engine.abort(cmd.request_id)
                    aborted.add(cmd.request_id)
                continue
            try:
                self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params, cmd.arrival_time)
            except Exception as exc:
                with self._cond:
                    self._num_unfinished -= 1
                _call(cmd.stream.loop, _resolve, cmd.accepted, exc)
                continue
            self._streams[cmd.request_id] = cmd.stream
            _call(cmd.stream.loop, _resolve, cmd.accepted, None)
        return aborted

    def _dispatch(self, outputs: list[RequestOutput], aborted: set[str], step_s: float) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        num_finished = 0
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            aborted.discard(output.request_id)
            if output.finished:
                del self._streams[output.request_id]
                num_finished += 1
            by_loop.setdefault(stream.loop, []).append((stream, output))
        for request_id in aborted:  # an engine that did not report an abort: close it here
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                num_finished += 1
                by_loop.setdefault(stream.loop, []).append((stream, _aborted_output(request_id)))
        with self._cond:
            self._num_unfinished -= num_finished
            self._stats = {**self.engine.stats(), "last_step_s": step_s}
        for loop, items in by_loop.items():
            _call(loop, _deliver, items)

    def _die(self, exc: BaseException) -> None:
        with self._cond:
            self._dead = exc
            commands, self._commands = self._commands, []
            self._num_unfinished = 0
        error = exc
        if not isinstance(exc, EngineDeadError):
            error = EngineDeadError(f"engine failed: {exc!r}")
        for cmd in commands:
            if isinstance(cmd, _Add):
                _call(cmd.stream.loop, _resolve, cmd.accepted, error)
        for stream in self._streams.values():
            _call(stream.loop, stream._fail, error)
        self._streams.clear()


def _aborted_output(request_id: str) -> RequestOutput:
    now = time.time()
    metrics = RequestMetrics(now, finished_time=now)
    return RequestOutput(request_id, [], [], "", True, "abort", metrics)


def _call(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: its requests have nobody to deliver to
        pass


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _deliver(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, output in items:
        stream._put(output)


__all__ = ["AsyncEngine", "EngineDeadError", "RequestStream"]
