"""Which engine a request reaches: the one model's state, or with several models the state of
the model its `model` field names (loaded first when needed), held while the request runs.

`RegistryFront` is the server-wide state when a registry serves: the phase of the server as a
whole, the drain of every model, and the model used last for stats and metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from appliance.server.app_keys import REGISTRY, STATE
from appliance.server.errors import APIError
from appliance.server.model_names import alias_target, unknown_model
from appliance.server.registry import ModelRegistry
from appliance.server.request_keys import KEY_ADMIN
from appliance.server.state import Phase, ServerState

MODEL_STATE = web.RequestKey("model_state", ServerState)
"""The state of the model a request resolved to (set by model_state)."""


class RegistryFront(ServerState):
    """The server's state when several models serve: no engine core of its own."""

    def __init__(self, settings: Any, registry: ModelRegistry) -> None:
        super().__init__(settings, defaults=settings.generation_defaults)
        self.registry = registry

    @property
    def _current(self) -> ServerState | None:
        registry = getattr(self, "registry", None)
        return registry.current.state if registry is not None else None

    @property
    def engine(self) -> Any:
        return self._current.engine if self._current is not None else None

    @engine.setter
    def engine(self, value: Any) -> None:  # the models' states hold the engines
        pass

    @property
    def core(self) -> Any:
        return self._current.core if self._current is not None else None

    @core.setter
    def core(self, value: Any) -> None:
        pass

    @property
    def model_name(self) -> str:
        return self.registry.current.name

    def serving_states(self) -> list[ServerState]:
        entries = self.registry.entries.values()
        return [e.state for e in entries if e.state is not None and e.state.core is not None]

    def models_summary(self) -> list[dict] | None:
        """Each model's name, status (/v1/models' statuses, or "failed" after a failed load,
        with its error), planned memory, pin and requests running now."""
        return [
            {
                "name": e.name,
                "status": "failed" if e.status == "failed" else e.public_status,
                "error": e.error if e.status == "failed" else None,
                "memory_bytes": e.memory_bytes,
                "pinned": e.spec.pinned,
                "requests": e.holds,
            }
            for e in self.registry.entries.values()
        ]

    def readiness(self) -> str | None:
        if self.phase is Phase.LOADING:
            return "loading"
        return "draining" if self.phase is Phase.DRAINING else None

    def liveness(self) -> str | None:
        return None  # a model whose core died answers its own requests with the error

    async def drain(self, timeout: float, force: Any = None) -> bool:
        self.phase = Phase.DRAINING
        return await self.registry.drain(timeout, force)

    async def close(self) -> None:
        await self.registry.close()


def ensure_ready(request: web.Request) -> None:
    """503 unless the server serves: the one model loaded, or (several models) not draining."""
    state = request.app[STATE]
    if REGISTRY not in request.app or state.phase is Phase.DRAINING:
        state.require_ready()


@asynccontextmanager
async def model_state(request: web.Request, model: str | None) -> AsyncIterator[ServerState]:
    """The ready state of the model `model` names, held (never unloaded) until the block ends;
    an unloaded model loads first. A 404 for a name nothing serves, a 503 for a model that
    failed to load."""
    app = request.app
    ensure_ready(request)
    if REGISTRY not in app:
        state = app[STATE]
        check_model(state, model)
        yield state
        return
    registry = app[REGISTRY]
    entry = await registry.acquire(model)
    try:
        entry.state.require_ready()
        request[MODEL_STATE] = entry.state
        yield entry.state
    finally:
        registry.release(entry)


def request_state(request: web.Request) -> ServerState:
    """The state of the model this request resolved to (the one model's without a registry)."""
    return request.get(MODEL_STATE) or request.app[STATE]


def served_name(request: web.Request, model: str | None) -> str:
    """The name the request's answer carries for `model`, without loading it."""
    if REGISTRY in request.app:
        return request.app[REGISTRY].resolve(model).name
    return request.app[STATE].model_name


def check_model(state: ServerState, model: str | None) -> None:
    """A missing model means the served one, and so does a name --model-alias maps to it; any
    other name is a 404 that names the served model and the flag."""
    served = (state.model_name, state.engine.model_name)
    if model is None or model in served:
        return
    target = alias_target(state.settings.model_aliases, model)
    if target in served:
        return
    raise APIError(
        404,
        unknown_model(model, state.model_name, target),
        param="model",
        code="model_not_found",
    )


def require_admin(request: web.Request) -> None:
    """403 unless the request's key is an admin key (open when the server has no keys)."""
    if request.app[STATE].settings.api_keys and not request.get(KEY_ADMIN):
        raise APIError(
            403,
            "loading and unloading models needs an admin key (--admin-key)",
            code="admin_key_required",
        )


WRONG_KIND = {
    "generate": "{model} generates text: it serves /v1/chat/completions and /v1/completions, "
    "not {route}; serve an embedding or reranking model for {route}",
    "embed": "{model} is an embedding model: it serves /v1/embeddings, not {route}",
    "rerank": "{model} is a reranking model: it serves /v1/rerank, not {route}",
}
"""What a request for another kind of model is told, by the served model's kind."""


def require_kind(state: ServerState, kind: str, route: str) -> None:
    """A 400 saying which route the served model answers when it is not of `kind`."""
    served = state.engine.kind
    if served != kind:
        message = WRONG_KIND[served].format(model=state.model_name, route=route)
        raise APIError(400, message, param="model", code="wrong_model_kind")
