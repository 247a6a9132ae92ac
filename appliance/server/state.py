"""ServerState: what the handlers share: the engine core (once started) and what it reported of
the engine, the phase (loading, ready, draining, failed), admission control over the bounded
queue, and the registry of in-flight requests."""

from __future__ import annotations

import asyncio
import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

from appliance.generation_defaults import GenerationDefaults
from appliance.server.errors import APIError
from appliance.server.request_grammar import GrammarCheck
from appliance.settings import ServeSettings
from engine.core.core_client import CoreClient
from engine.core.info import EngineInfo
from engine.core.process import PHASE_START
from engine.startup.phases import WARMING_UP, phase_words

LOADING_RETRY_S = 5
"""Retry-After (seconds) of the 503 a request gets while the model loads."""


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
    engine: EngineInfo | None = None
    """What the core reported of its engine (names, config, plan, tokenizer); None while
    loading."""
    core: CoreClient | None = None
    process: Any = None
    """The engine core's CoreProcess, when this front end started it."""
    phase: Phase = Phase.LOADING
    load_error: str | None = None
    load_refused: bool = False
    """The engine refused its configuration (a model that is not there, pins that cannot fit):
    a restart fails the same way."""
    load_failed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the engine failed to load (phase FAILED, load_error says why)."""
    started_at: float = field(default_factory=time.time)
    inflight: dict[str, InFlight] = field(default_factory=dict)
    num_inflight_seqs: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    core_gone: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the engine core died while serving: the front end should exit non-zero."""
    grammar_check: GrammarCheck | None = None
    """Compiles requests' grammars (None for a model without a tokenizer)."""
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    """What a request's omitted sampling fields become (the model's, the overrides)."""
    loading: str = PHASE_START
    image_processor: Any = None
    """The model's engine.multimodal ImageProcessor, loaded at the first request with images."""
    """While loading: the start-up phase the core reported last
    (engine.startup.phases.PHASE_WORDS)."""

    def __post_init__(self) -> None:
        self._idle.set()

    async def attach(self, info: EngineInfo, address: str, process: Any = None) -> None:
        """Connect to a started core (phase stays LOADING until ready())."""
        self.engine, self.process = info, process
        if info.tokenizer is not None:
            self.grammar_check = GrammarCheck(info, self.settings.grammar_timeout or None)
        self.core = CoreClient(address, info.stats, on_dead=self._core_died)
        await self.core.start()

    def _core_died(self, reason: str) -> None:
        if self.phase is not Phase.DRAINING:
            self.phase = Phase.FAILED
        self.load_error = reason
        self.core_gone.set()

    async def close(self) -> None:
        """Stop the core this front end started (after a drain) and wait for it to exit."""
        if self.grammar_check is not None:
            self.grammar_check.close()
        if self.core is not None:
            await self.core.close(shutdown_core=self.process is not None)
        if self.process is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.process.join, 30.0)

    def ready(self) -> None:
        self.phase = Phase.READY

    def fail_load(self, reason: str, refused: bool = False) -> None:
        self.phase, self.load_error, self.load_refused = Phase.FAILED, reason, refused
        self.load_failed.set()

    @property
    def loading_words(self) -> str:
        """What the engine is doing while it loads, in a user's words ("loading weights")."""
        return phase_words(self.loading)

    @property
    def is_warming_up(self) -> bool:
        """While loading: the weights are in and the engine warms up."""
        return self.loading_words == WARMING_UP

    def readiness(self) -> str | None:
        """Why this server should get no traffic now ("loading", "warming up", "draining",
        "engine core gone", "engine failed to load"), or None when it serves."""
        if self.core_gone.is_set():
            return "engine core gone"
        if self.phase is Phase.LOADING:
            return "warming up" if self.is_warming_up else "loading"
        if self.phase is Phase.DRAINING:
            return "draining"
        if self.phase is Phase.FAILED:
            return "engine failed to load"
        return None if self.core is not None and self.core.is_running else "engine core gone"

    def liveness(self) -> str | None:
        """Why this server should be restarted ("engine core gone" or "engine failed to load"),
        or None: loading, warming up, serving and draining are all alive."""
        if self.core_gone.is_set():
            return "engine core gone"
        if self.phase is Phase.FAILED:
            return "engine failed to load"
        return None

    def serving_states(self) -> list[ServerState]:
        """The states of the engines this server runs (this one; a registry: each loaded
        model's), for the metrics of each."""
        return [self]

    def models_summary(self) -> list[dict] | None:
        """With several models, each one's name, status and memory (None for one model)."""
        return None

    @property
    def model_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return self.engine.model_name if self.engine is not None else "loading"

    def require_ready(self) -> None:
        """503 unless the engine is loaded and the server is not draining."""
        if self.phase is Phase.READY and self.core and self.core.is_running:
            return
        if self.phase is Phase.LOADING:
            raise APIError(
                503,
                f"the model is loading ({self.loading_words}); retry in a few seconds",
                code="loading",
                headers={"Retry-After": str(LOADING_RETRY_S)},
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
        stats = self.core.stats()
        waiting = stats["num_waiting"]
        # Other API workers' requests count too: the core's own count covers every front end.
        full = max(self.num_inflight_seqs, stats["num_unfinished"]) + k > capacity
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
        if force is not None and force.is_set():
            reason = APIError(
                503,
                "the server shut down before this request finished (cut by a second signal)",
                code="shutdown_signal",
            )
        else:
            reason = APIError(
                503,
                f"the server shut down before this request finished (drain timeout {timeout:g} s)",
                code="drain_timeout",
            )
        for entry in list(self.inflight.values()):
            entry.abort_reason = reason
            for engine_id in entry.engine_ids:
                self.core.abort(engine_id)
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
