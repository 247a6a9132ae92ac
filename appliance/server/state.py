"""ServerState: what the handlers share: the engine (once loaded), the phase (loading, ready,
draining), admission control over the bounded queue, and the registry of in-flight requests."""

from __future__ import annotations

import asyncio
import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

from appliance.server.errors import APIError
from appliance.settings import ServeSettings
from engine.async_engine import AsyncEngine


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ok"
    DRAINING = "draining"
    FAILED = "error"


@dataclass
class InFlight:
    """One admitted HTTP request: its engine sub-requests and, if the server cut it, why."""

    request_id: str
    engine_ids: list[str]
    abort_reason: APIError | None = None


@dataclass
class ServerState:
    settings: ServeSettings
    engine: Any = None
    """The LLMEngine (or a fake with its contract); None while loading."""
    async_engine: AsyncEngine | None = None
    phase: Phase = Phase.LOADING
    load_error: str | None = None
    started_at: float = field(default_factory=time.time)
    inflight: dict[str, InFlight] = field(default_factory=dict)
    num_inflight_seqs: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    def attach(self, engine: Any) -> None:
        """Wrap a loaded engine and start its loop thread (phase stays LOADING until ready())."""
        self.engine = engine
        self.async_engine = AsyncEngine(engine)
        self.async_engine.start()

    def ready(self) -> None:
        self.phase = Phase.READY

    @property
    def model_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return self.engine.model_name if self.engine is not None else "loading"

    def require_ready(self) -> None:
        """503 unless the engine is loaded and the server is not draining."""
        if self.phase is Phase.READY and self.async_engine and self.async_engine.is_running:
            return
        if self.phase is Phase.LOADING:
            raise APIError(
                503,
                "the model is still loading; retry shortly",
                code="loading",
                headers={"Retry-After": "5"},
            )
        if self.phase is Phase.DRAINING:
            raise APIError(
                503,
                "the server is shutting down and accepts no new requests",
                code="draining",
                headers={"Retry-After": "30"},
            )
        raise APIError(
            503,
            f"the engine is not running: {self.load_error or 'it failed'}",
            code="engine_failed",
        )

    # --- admission ------------------------------------------------------------------------
    def admit(self, request_id: str, engine_ids: list[str], retry_after_s: float) -> InFlight:
        """Register a request or raise 429: at most max_num_seqs running + max_queue waiting."""
        k = len(engine_ids)
        cfg = self.engine.config
        capacity = cfg.max_num_seqs + self.settings.max_queue
        waiting = self.async_engine.stats()["num_waiting"]
        full = self.num_inflight_seqs + k > capacity
        # Fewer may run than max_num_seqs when KV blocks run out: then the engine's queue is real.
        queue_full = waiting > 0 and waiting + k > self.settings.max_queue
        if full or queue_full:
            retry = str(max(1, min(60, math.ceil(retry_after_s))))
            raise APIError(
                429,
                f"the server is at capacity ({self.num_inflight_seqs} requests in flight, "
                f"queue limit {self.settings.max_queue}); retry after {retry} s",
                code="queue_full",
                headers={"Retry-After": retry},
            )
        entry = InFlight(request_id, engine_ids)
        self.inflight[request_id] = entry
        self.num_inflight_seqs += k
        self._idle.clear()
        return entry

    def release(self, entry: InFlight) -> None:
        if self.inflight.pop(entry.request_id, None) is not None:
            self.num_inflight_seqs -= len(entry.engine_ids)
        if not self.inflight:
            self._idle.set()

    def unique_id(self, request_id: str) -> str:
        """request_id itself, or with a suffix when a request with that id is in flight."""
        candidate, k = request_id, 1
        while candidate in self.inflight:
            k += 1
            candidate = f"{request_id}~{k}"
        return candidate

    # --- drain ----------------------------------------------------------------------------
    async def drain(self, timeout: float, force: asyncio.Event | None = None) -> bool:
        """Stop admitting, wait up to `timeout` s (or until `force` is set) for in-flight
        requests, then cut the rest. Returns True when everything finished in time.

        Cut requests end with an error (an error event for streams), never a silent close.
        """
        self.phase = Phase.DRAINING
        if await _wait_any(self._idle, force, timeout):
            return True
        reason = APIError(
            503,
            f"the server shut down before this request finished (drain timeout {timeout:g} s)",
            code="drain_timeout",
        )
        for entry in list(self.inflight.values()):
            entry.abort_reason = reason
            for engine_id in entry.engine_ids:
                self.async_engine.abort(engine_id)
        await _wait_any(self._idle, None, 5.0)
        return False


async def _wait_any(idle: asyncio.Event, force: asyncio.Event | None, timeout: float) -> bool:
    """True when `idle` is set within `timeout`; False on timeout or when `force` is set."""
    waits = [asyncio.ensure_future(idle.wait())]
    if force is not None:
        waits.append(asyncio.ensure_future(force.wait()))
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return idle.is_set()
