"""CoreClient: the front end's side of the engine core: submit, stream, abort, read stats.

Everything runs on the event loop that started it (zmq.asyncio): a receiver task turns each
frame from the core into stream updates; adds and aborts are sent at once. The client learns
that the core is gone from its socket (a monitor sees the IPC connection drop the moment the
process dies) or from a last frame that says why: then every open stream fails, every new
request is refused, and `dead` is set for whoever supervises the front end.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from engine.core import wire
from engine.core.stream import EngineDeadError, RequestStream
from engine.multimodal import ImageInput
from engine.sampling_params import SamplingParams
from engine.scheduling.request import RequestOutput

logger = logging.getLogger("engine.core")


class CoreClient:
    def __init__(
        self, address: str, stats: dict, on_dead: Callable[[str], None] | None = None
    ) -> None:
        """`stats`: the engine's stats when the core started (EngineInfo.stats)."""
        self.address = address
        self.on_dead = on_dead
        """Called once, on the loop, with the reason, when the core is found gone."""
        self.dead: str | None = None
        self._tag = f"{uuid.uuid4().hex[:8]}/"
        """Prefixed to request ids in the core: front ends sharing a core may both be sent the
        same id (a client's X-Request-Id) without colliding there."""
        self._streams: dict[str, RequestStream] = {}
        self._assembled: dict[str, wire.Assembled] = {}
        self._accepting: dict[str, asyncio.Future] = {}
        self._stats = stats
        self._kv: dict[str, int] | None = None
        self._tasks: list[asyncio.Task] = []
        self._ctx: zmq.asyncio.Context | None = None
        self._sock = None
        self._monitor = None

    # --- life cycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.LINGER, 0)
        events = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        self._monitor = monitor = self._sock.get_monitor_socket(events)
        self._sock.connect(self.address)
        self._sock.send(wire.pack([wire.HELLO]))
        self._tasks = [
            asyncio.create_task(self._receive(), name="core-receive"),
            asyncio.create_task(self._watch(monitor), name="core-watch"),
        ]

    async def close(self, shutdown_core: bool = False) -> None:
        """Stop receiving (telling the core to stop first when `shutdown_core`)."""
        if shutdown_core and self.dead is None and self._sock is not None:
            await self._sock.send(wire.pack([wire.SHUTDOWN]))
        self._die("the engine was shut down", notify=False)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._sock.close(linger=1000 if shutdown_core else 0)
            self._ctx.term()
            self._sock = None

    @property
    def is_running(self) -> bool:
        return self._sock is not None and self.dead is None

    # --- requests --------------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        images: list[ImageInput] | None = None,
    ) -> RequestStream:
        """Submit a request and wait until the core accepted it. The engine's ValueError (bad
        prompt, too long, duplicate id, images it cannot take) is raised here, before any
        output. `images`: the prompt's images (engine.multimodal)."""
        if not self.is_running:
            raise EngineDeadError(f"the engine is not running ({self.dead or 'not started'})")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        accepted = asyncio.get_running_loop().create_future()
        stream = RequestStream(request_id)
        self._streams[request_id] = stream
        self._accepting[request_id] = accepted
        prompt_ids = list(prompt) if isinstance(prompt, list) else []
        self._assembled[request_id] = wire.Assembled(request_id, prompt_ids)
        params_wire = wire.params_to_wire(params)
        frame = [wire.ADD, self._tag + request_id, prompt, params_wire, arrival_time]
        if images:
            frame.append(wire.images_to_wire(images))
        self._sock.send(wire.pack(frame))
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        except BaseException:
            self._forget(request_id)
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
        (client gone, task cancelled) aborts the request in the core."""
        stream = await self.add_request(request_id, prompt, params, arrival_time)
        try:
            async for output in stream:
                yield output
        finally:
            if not stream.finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Ask the core to abort a request (it frees the request's KV blocks); returns at once.
        The stream ends with a final output whose finish_reason is "abort"."""
        if self.is_running and request_id in self._streams:
            self._sock.send(wire.pack([wire.ABORT, self._tag + request_id]))

    def stats(self) -> dict:
        """The engine's counters as of the core's last step, plus the requests in the core."""
        return dict(self._stats)

    def kv_blocks_by_request(self) -> dict[str, int] | None:
        """KV blocks per running request as the core last sent them; None if it never did."""
        return self._kv

    # --- the receiver ----------------------------------------------------------------------
    async def _receive(self) -> None:
        while True:
            frame = wire.unpack(await self._sock.recv())
            if "dead" in frame:
                self._die(frame["dead"])
                return
            cut = len(self._tag)
            for request_id, error, prompt_ids in frame["a"]:
                self._accepted(request_id[cut:], error, prompt_ids)
            for delta in frame["o"]:
                self._deliver(delta[0][cut:], delta)
            self._stats = frame["s"]
            if "kv" in frame:
                mine = self._tag
                self._kv = {rid[cut:]: n for rid, n in frame["kv"].items() if rid.startswith(mine)}

    def _accepted(self, request_id: str, error: str | None, prompt_ids: list | None) -> None:
        future = self._accepting.pop(request_id, None)
        if prompt_ids is not None and request_id in self._assembled:
            self._assembled[request_id].prompt_token_ids = prompt_ids
        if future is None or future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(ValueError(error))

    def _deliver(self, request_id: str, delta: list) -> None:
        assembled = self._assembled.get(request_id)
        stream = self._streams.get(request_id)
        if assembled is None or stream is None:
            return
        output = assembled.apply(delta)
        if output.finished:
            self._forget(request_id)
        stream.put(output)

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._assembled.pop(request_id, None)
        self._accepting.pop(request_id, None)

    async def _watch(self, monitor) -> None:
        connected = False
        while True:
            event = await recv_monitor_message(monitor)
            if event["event"] == zmq.EVENT_CONNECTED:
                connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED and connected:
                await asyncio.sleep(0.05)  # a last frame saying why may still be in the queue
                self._die("the engine process exited")
                return

    def _die(self, reason: str, notify: bool = True) -> None:
        if self.dead is not None:
            return
        self.dead = reason
        error = EngineDeadError(reason)
        for future in self._accepting.values():
            if not future.done():
                future.set_exception(error)
        for stream in self._streams.values():
            stream.fail(error)
        self._streams.clear()
        self._assembled.clear()
        self._accepting.clear()
        if notify:
            logger.error("%s", reason)
            if self.on_dead is not None:
                self.on_dead(reason)
