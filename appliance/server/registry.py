"""ModelRegistry: several models behind one front end, each in its own engine core process with
its own plan. A request naming an unloaded model loads it (loads are serialised by one lock);
before a load, the least recently used unpinned model with nothing in flight is unloaded until
the new one fits the memory budget (--models-memory) and the count (--models-max); a model
idle past its keep_alive is unloaded. An unload drains first: a running stream finishes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.model_memory import expected_bytes, load_problem, planned_bytes
from appliance.model_specs import ModelSpec
from appliance.server.errors import APIError
from appliance.server.model_names import alias_target
from appliance.server.state import Phase, ServerState
from appliance.settings import ServeSettings
from engine.models.model_kind import model_kind

logger = logging.getLogger("appliance.server")
GIB = 1024**3
SWEEP_INTERVAL_S = 1.0
Starter = Callable[[ServerState, Any], Awaitable[None]]
"""Starts a model's engine core into a fresh ServerState from a loader (app._load)."""


@dataclass
class ModelEntry:
    """One model of the registry and where it stands."""

    spec: ModelSpec
    settings: ServeSettings
    state: ServerState | None = None
    """Its engine core's state while loaded or loading; None when unloaded."""
    status: str = "unloaded"
    """"unloaded", "loading", "loaded", "unloading" or "failed"."""
    error: str | None = None
    """Why the last load failed."""
    memory_bytes: int | None = None
    """The planned bytes of its last load; before it, its plan made ahead (the CPU) or its
    weight files' size; None until the registry first needs it."""
    last_used: float = field(default_factory=time.monotonic)
    holds: int = 0
    """Requests running on this model (an unload waits for them; it is never chosen to make
    room while any runs)."""
    waiting: int = 0
    """Requests waiting for this model to load (it is not chosen to make room either)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        """What the loaded engine reports; before a load, what the folder says (a .gguf file
        or a preset generates)."""
        info = self.state.engine if self.state is not None else None
        if info is not None:
            return info.kind
        folder = Path(self.spec.path)
        if not (folder / "config.json").is_file():
            return "generate"
        try:
            return model_kind(folder, task=self.settings.task).kind
        except (OSError, ValueError):  # an unreadable config: the load will say why
            return "generate"

    @property
    def is_loaded(self) -> bool:
        s = self.state
        return (
            self.status == "loaded"
            and s is not None
            and s.phase is Phase.READY
            and s.core is not None
            and s.core.is_running
        )

    @property
    def is_evictable(self) -> bool:
        return self.status == "loaded" and not self.spec.pinned and self.holds + self.waiting == 0

    @property
    def public_status(self) -> str:
        """What /v1/models says: "loaded" (until an unload's drain ends), "loading" or
        "unloaded" (a failed load: "unloaded" with its error)."""
        statuses = {"loaded": "loaded", "unloading": "loaded", "loading": "loading"}
        return statuses.get(self.status, "unloaded")


class ModelRegistry:
    """name -> engine core, loaded on demand. `start` fills a fresh ServerState from a loader
    (it never raises: a failure leaves the state FAILED with load_error)."""

    def __init__(self, settings: ServeSettings, start: Starter, make_loader: Callable) -> None:
        self.settings = settings
        self.entries = {
            spec.name: ModelEntry(spec, settings.for_model(spec)) for spec in settings.model_specs
        }
        self._start, self._make_loader = start, make_loader
        self._lock = asyncio.Lock()
        self._shedding: asyncio.Task | None = None
        self._loading: dict[str, asyncio.Task] = {}
        self.current: ModelEntry = next(iter(self.entries.values()))
        """The model used last (stats and metrics read it)."""

    # --- names ----------------------------------------------------------------------------
    def resolve(self, model: str | None) -> ModelEntry:
        """The entry `model` names (its name, an alias, --model-alias; None = the first
        model), or the 404 naming the served models."""
        if model is None:
            return next(iter(self.entries.values()))
        if model in self.entries:
            return self.entries[model]
        for entry in self.entries.values():
            if alias_target([(a, entry.name) for a in entry.spec.aliases], model):
                return entry
        target = alias_target(self.settings.model_aliases, model)
        if target in self.entries:
            return self.entries[target]
        served = ", ".join(f"'{n}'" for n in self.entries)
        raise APIError(
            404,
            f"The model '{model}' does not exist; this server serves {served}",
            param="model",
            code="model_not_found",
        )

    # --- requests -------------------------------------------------------------------------
    async def acquire(self, model: str | None) -> ModelEntry:
        """The loaded entry `model` names, loading it first when needed (the caller waits),
        held until `release`; an APIError when it cannot serve."""
        entry = self.resolve(model)
        entry.waiting += 1  # a model loaded for waiting requests is not unloaded before they run
        try:
            while not entry.is_loaded:
                if entry.status == "failed":
                    raise load_failed(entry)
                # shielded: a client that goes away while it waits does not cancel the load
                await asyncio.shield(self._loading_task(entry))
        finally:
            entry.waiting -= 1
        entry.holds += 1
        entry.last_used = time.monotonic()
        self.current = entry
        return entry

    def _loading_task(self, entry: ModelEntry) -> asyncio.Task:
        """The one task loading `entry` (under the lock), shared by every request waiting."""
        task = self._loading.get(entry.name)
        if task is None:
            task = asyncio.create_task(self._load_locked(entry))
            self._loading[entry.name] = task
            task.add_done_callback(lambda _: self._loading.pop(entry.name, None))
        return task

    async def _load_locked(self, entry: ModelEntry) -> None:
        async with self._lock:
            if not entry.is_loaded and entry.status != "failed":
                await self._load(entry)

    def release(self, entry: ModelEntry) -> None:
        entry.holds -= 1
        entry.last_used = time.monotonic()
        if entry.holds == 0 and self._over_limits() and self._victim(None) is not None:
            # a load went over the limits beside a busy model: shed the idle ones now
            self._shedding = self._shedding or asyncio.create_task(self._shed())

    async def _shed(self) -> None:
        try:
            async with self._lock:
                while self._over_limits() and (victim := self._victim(None)) is not None:
                    logger.info("unloading %s: over the registry's limits", victim.name)
                    await self._unload(victim)
        finally:
            self._shedding = None

    # --- loading and unloading ------------------------------------------------------------
    async def load(self, name: str) -> ModelEntry:
        """Load `name` now (a failed model is tried again)."""
        entry = self.resolve(name)
        async with self._lock:
            if not entry.is_loaded:
                await self._load(entry)
        return entry

    async def unload(self, name: str) -> ModelEntry:
        """Unload `name` after its requests finish (pinned or not)."""
        entry = self.resolve(name)
        async with self._lock:
            await self._unload(entry)
        return entry

    async def _load(self, entry: ModelEntry) -> None:
        if entry.state is not None:  # a core that died or a failed load: clear it first
            await self._unload(entry)
        loop = asyncio.get_running_loop()
        problem = await loop.run_in_executor(None, load_problem, entry.settings)
        if problem is not None:  # refused before another model is unloaded for it
            entry.status, entry.error = "failed", problem
            logger.error("the model %s cannot load: %s", entry.name, problem)
            return
        if entry.memory_bytes is None:  # plan it once, beside the event loop
            entry.memory_bytes = await loop.run_in_executor(None, expected_bytes, entry.settings)
        await self._make_room(entry)
        while True:
            entry.status, entry.error = "loading", None
            try:  # the model's generation_config.json is read here: a broken one fails it
                defaults = entry.settings.generation_defaults
            except ValueError as exc:
                entry.status, entry.error = "failed", str(exc)
                logger.error("the model %s cannot load: %s", entry.name, exc)
                return
            state = ServerState(entry.settings, defaults=defaults)
            entry.state = state
            logger.info("loading the model %s (%s)", entry.name, entry.settings.model)
            await self._start(state, self._make_loader(entry.settings))
            if state.phase is Phase.READY:
                entry.status = "loaded"
                entry.memory_bytes = planned_bytes(state.engine.plan) or entry.memory_bytes
                entry.last_used = time.monotonic()
                return
            await state.close()
            entry.state, entry.error = None, state.load_error or "it failed"
            victim = self._victim(entry) if state.load_refused else None
            if victim is None:  # nothing more to free: the refusal or failure stands
                entry.status = "failed"
                logger.error("the model %s failed to load: %s", entry.name, entry.error)
                return
            logger.info("the model %s does not fit: unloading %s", entry.name, victim.name)
            await self._unload(victim)

    async def _make_room(self, entry: ModelEntry) -> None:
        while not self._fits(entry):
            victim = self._victim(entry)
            if victim is None:
                logger.warning("the model %s loads over the registry's limits", entry.name)
                return
            logger.info("unloading %s to make room for %s", victim.name, entry.name)
            await self._unload(victim)

    def _fits(self, entry: ModelEntry) -> bool:
        loaded = [e for e in self.entries.values() if e.state is not None and e is not entry]
        return not self._over(loaded + [entry])

    def _over_limits(self) -> bool:
        return self._over([e for e in self.entries.values() if e.state is not None])

    def _over(self, loaded: list[ModelEntry]) -> bool:
        """Whether these models together pass --models-max or --models-memory."""
        if self.settings.models_max is not None and len(loaded) > self.settings.models_max:
            return True
        if self.settings.models_memory is None:
            return False
        return sum(e.memory_bytes or 0 for e in loaded) > self.settings.models_memory * GIB

    def _victim(self, entry: ModelEntry | None) -> ModelEntry | None:
        """The least recently used unpinned loaded model with nothing in flight."""
        idle = [e for e in self.entries.values() if e is not entry and e.is_evictable]
        return min(idle, key=lambda e: e.last_used, default=None)

    async def _unload(self, entry: ModelEntry) -> None:
        state = entry.state
        if state is None:
            entry.status = "unloaded" if entry.status != "failed" else entry.status
            return
        entry.status = "unloading"
        while entry.holds > 0:  # requests already past acquire() finish first
            await asyncio.sleep(0.02)
        await state.drain(self.settings.drain_timeout)
        await state.close()
        entry.state, entry.status = None, "unloaded"
        logger.info("unloaded the model %s", entry.name)

    # --- life -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the pinned models (else the first) at start-up."""
        pinned = [e for e in self.entries.values() if e.spec.pinned]
        for entry in pinned or [next(iter(self.entries.values()))]:
            async with self._lock:
                await self._load(entry)

    async def sweep(self) -> None:
        """Unload models idle past their keep_alive, for ever (a cleanup-context task)."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for entry in list(self.entries.values()):
                keep = entry.spec.keep_alive
                if keep is not None and entry.is_evictable and now - entry.last_used > keep:
                    async with self._lock:
                        if entry.is_evictable and time.monotonic() - entry.last_used > keep:
                            logger.info("the model %s was idle %gs: unloading", entry.name, keep)
                            await self._unload(entry)

    async def drain(self, timeout: float, force: asyncio.Event | None = None) -> bool:
        """Drain every loaded model at once; True when all finished in time."""
        states = [e.state for e in self.entries.values() if e.state is not None]
        done = await asyncio.gather(*(s.drain(timeout, force) for s in states))
        return all(done)

    async def close(self) -> None:
        tasks = [t for t in (self._shedding, *self._loading.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for entry in self.entries.values():
            if entry.state is not None:
                await entry.state.close()
                entry.state, entry.status = None, "unloaded"


def load_failed(entry: ModelEntry) -> APIError:
    """The 503 a request for a model that failed to load gets."""
    return APIError(
        503,
        f"the model '{entry.name}' failed to load: {entry.error}; an admin may retry with "
        f"POST /v1/models/{entry.name}/load",
        param="model",
        code="model_load_failed",
    )
