"""The model routes: /v1/models (with several models, each one's status, kind and memory),
/v1/models/{name}, and loading and unloading by hand, POST /v1/models/{name}/load and /unload
(admin keys only when the server has API keys), each answering the model's card once the load
or the unload (after its requests finish) is done. A loaded model's card also says whether it
reasons (`reasoning`) and what its prompts may hold (`input_modalities`), for the web page."""

from __future__ import annotations

from aiohttp import web

from appliance.server.app_keys import REGISTRY, STATE
from appliance.server.errors import APIError
from appliance.server.model_route import check_model, ensure_ready, require_admin
from appliance.server.registry import ModelEntry, ModelRegistry, load_failed
from appliance.server.request_grammar import REASONING_OPEN
from appliance.server.schema.responses import ModelCard, ModelList
from appliance.server.state import ServerState

routes = web.RouteTableDef()


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    if REGISTRY in request.app:
        cards = [registry_card(request.app, e) for e in request.app[REGISTRY].entries.values()]
        return web.json_response(ModelList(data=cards).model_dump(exclude_none=True))
    state = request.app[STATE]
    state.require_ready()
    return web.json_response(ModelList(data=[_model_card(state)]).model_dump(exclude_none=True))


@routes.get("/v1/models/{model}")
async def get_model(request: web.Request) -> web.Response:
    if REGISTRY in request.app:
        entry = request.app[REGISTRY].resolve(request.match_info["model"])
        return web.json_response(registry_card(request.app, entry).model_dump(exclude_none=True))
    state = request.app[STATE]
    state.require_ready()
    check_model(state, request.match_info["model"])
    return web.json_response(_model_card(state).model_dump(exclude_none=True))


def _model_card(state: ServerState) -> ModelCard:
    return ModelCard(
        id=state.model_name,
        created=int(state.started_at),
        owned_by="llm-appliance",
        root=state.engine.model_name,
        max_model_len=state.engine.config.max_model_len,
        **_abilities(state.engine),
    )


def _abilities(engine) -> dict:
    """What a loaded engine's card says of it: reasoning when its chat template writes
    `<think>` (as chat_output reads it), and images when it reads them (as image_inputs
    checks)."""
    template = getattr(engine.tokenizer, "chat_template", None) or ""
    modalities = ["text", "image"] if getattr(engine, "takes_images", False) else ["text"]
    return {"reasoning": REASONING_OPEN in str(template), "input_modalities": modalities}


def registry_card(app: web.Application, entry: ModelEntry) -> ModelCard:
    """A registry model's card: OpenAI's fields, its status, kind and planned memory."""
    engine = entry.state.engine if entry.status == "loaded" and entry.state else None
    return ModelCard(
        id=entry.name,
        created=int(app[STATE].started_at),
        owned_by="llm-appliance",
        root=engine.model_name if engine is not None else entry.settings.model or entry.name,
        max_model_len=engine.config.max_model_len if engine is not None else None,
        status=entry.public_status,
        kind=entry.kind,
        memory_bytes=entry.memory_bytes,
        pinned=entry.spec.pinned,
        error=entry.error if entry.status == "failed" else None,
        **(_abilities(engine) if engine is not None else {}),
    )


def _registry(request: web.Request) -> ModelRegistry:
    require_admin(request)
    ensure_ready(request)
    if REGISTRY not in request.app:
        raise APIError(
            400,
            "this server serves one model, always loaded; serve several with --model NAME=PATH "
            "or --models-dir DIR",
            code="no_model_registry",
        )
    return request.app[REGISTRY]


@routes.post("/v1/models/{model}/load")
async def load_model(request: web.Request) -> web.Response:
    """Load the model now (a model that failed to load is tried again)."""
    entry = await _registry(request).load(request.match_info["model"])
    if entry.status == "failed":
        raise load_failed(entry)
    return web.json_response(registry_card(request.app, entry).model_dump(exclude_none=True))


@routes.post("/v1/models/{model}/unload")
async def unload_model(request: web.Request) -> web.Response:
    """Unload the model once its requests finish (a pinned one too: the admin asked)."""
    entry = await _registry(request).unload(request.match_info["model"])
    return web.json_response(registry_card(request.app, entry).model_dump(exclude_none=True))
