"""Generation: one HTTP request's choices running in the engine, consumed under its deadlines.

It submits every choice (prompt x n) to the engine core, merges their output streams, enforces
the time-to-first-token, total and stall timeouts, turns a server-side cut (drain) into an
error, and aborts whatever is unfinished when it is closed early (client gone, error, timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from appliance.server.chat_output import ChatStream
from appliance.server.errors import APIError, bad_request, timeout_error
from appliance.server.records import ChoiceRecord, RequestRecord
from appliance.server.state import InFlight
from appliance.settings import ServeSettings
from engine.core.core_client import CoreClient
from engine.core.stream import EngineDeadError, RequestStream
from engine.multimodal import ImageInput
from engine.sampling_params import SamplingParams
from engine.scheduling.request import RequestOutput


@dataclass
class Choice:
    """One engine sub-request and what has been sent of it so far."""

    record: ChoiceRecord
    prompt_ids: list[int]
    params: SamplingParams
    stream: RequestStream | None = None
    last: RequestOutput | None = None
    sent_text: int = 0
    sent_logprobs: int = 0
    last_token_at: float | None = None
    chat: ChatStream | None = None
    """Where the chat text is parsed (reasoning, tool calls) and streamed: the parser's state."""
    images: list[ImageInput] | None = None
    """The prompt's images (their placeholders are in prompt_ids); None for text alone."""

    @property
    def engine_id(self) -> str:
        return self.record.engine_id


class Generation:
    def __init__(
        self,
        engine: CoreClient,
        settings: ServeSettings,
        record: RequestRecord,
        entry: InFlight,
        choices: list[Choice],
        on_itl=None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.record = record
        self.entry = entry
        self.choices = choices
        self.on_itl = on_itl
        """Called with each inter-token latency sample (seconds)."""

    async def start(self) -> None:
        """Submit every choice; the engine's ValueError becomes a 400 before any output."""
        try:
            for c in self.choices:
                # only a prompt with images passes them: text goes as it always went
                extra = {"images": c.images} if c.images else {}
                c.stream = await self.engine.add_request(
                    c.engine_id,
                    c.prompt_ids,
                    c.params,
                    arrival_time=self.record.received_at,
                    **extra,
                )
        except ValueError as exc:
            self.abort_unfinished()
            raise bad_request(str(exc)) from None
        except EngineDeadError as exc:
            self.abort_unfinished()
            raise APIError(503, str(exc), code="engine_failed") from None
        except BaseException:
            self.abort_unfinished()
            raise
        self.record.status = "running"
        self.record.event("queued", engine_ids=[c.engine_id for c in self.choices])

    def abort_unfinished(self) -> None:
        for c in self.choices:
            if c.stream is not None and not c.stream.finished:
                self.engine.abort(c.engine_id)

    async def outputs(self) -> AsyncIterator[tuple[Choice, RequestOutput]]:
        """(choice, cumulative output) as they come, until every choice has finished."""
        queue: asyncio.Queue = asyncio.Queue()
        pumps = [asyncio.create_task(self._pump(c, queue)) for c in self.choices]
        remaining = len(pumps)
        try:
            while remaining:
                choice, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    remaining -= 1
                    if item.finish_reason == "abort" and self.entry.abort_reason is not None:
                        raise self.entry.abort_reason
                yield choice, item
        finally:
            for task in pumps:
                task.cancel()
            self.abort_unfinished()

    async def _pump(self, c: Choice, queue: asyncio.Queue) -> None:
        try:
            while True:
                kind, deadline = self._deadline(c)
                try:
                    async with asyncio.timeout_at(deadline):
                        output = await c.stream.next()
                except TimeoutError:
                    limit = getattr(self.settings, kind)
                    raise timeout_error(kind, limit) from None
                self._observe(c, output)
                queue.put_nowait((c, output))
                if output.finished:
                    return
        except EngineDeadError as exc:
            queue.put_nowait((c, APIError(500, f"the engine failed: {exc}", code="engine_failed")))
        except Exception as exc:
            queue.put_nowait((c, exc))

    def _deadline(self, c: Choice) -> tuple[str, float | None]:
        """The nearest deadline for this choice's next output, on the event loop's clock."""
        s = self.settings
        loop_now, wall_now = asyncio.get_running_loop().time(), time.time()
        candidates = []
        if s.request_timeout:
            candidates.append((self.record.received_at + s.request_timeout, "request_timeout"))
        if c.last_token_at is None and s.ttft_timeout:
            candidates.append((self.record.received_at + s.ttft_timeout, "ttft_timeout"))
        if c.last_token_at is not None and s.stall_timeout:
            candidates.append((c.last_token_at + s.stall_timeout, "stall_timeout"))
        if not candidates:
            return "request_timeout", None
        wall_deadline, kind = min(candidates)
        return kind, loop_now + (wall_deadline - wall_now)

    def _observe(self, c: Choice, output: RequestOutput) -> None:
        now = time.time()
        new = c.record.update(output, now)
        if new:
            if c.last_token_at is not None and self.on_itl is not None:
                self.on_itl((now - c.last_token_at) / new, new)
            c.last_token_at = now
        c.last = output
