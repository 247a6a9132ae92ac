"""Loading and unloading models by hand: POST /v1/models/{name}/load and /unload (admin keys
only when the server has API keys). Each answers the model's card once the load or the unload
(after its requests finish) is done."""

from __future__ import annotations

from aiohttp import web

from appliance.server.app_keys import REGISTRY
from appliance.server.errors import APIError
from appliance.server.model_route import ensure_ready, require_admin
from appliance.server.openai_routes import registry_card
from appliance.server.registry import ModelRegistry, load_failed

routes = web.RouteTableDef()


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
