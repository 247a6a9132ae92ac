"""Operational routes: /health, /health/live, /health/ready, /metrics, /tokenize, /detokenize,
/v1/stats (+ SSE stream), /v1/requests/{id} and /openapi.json."""

from __future__ import annotations

import asyncio
from functools import partial

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from appliance.server.app_keys import METRICS, STATE, TRACKER
from appliance.server.body import read_json
from appliance.server.errors import APIError
from appliance.server.model_route import ensure_ready, model_state
from appliance.server.openai_routes import SSE_HEADERS, offload
from appliance.server.openapi import openapi_spec
from appliance.server.protocol import parse_detokenize, parse_tokenize
from appliance.server.responses import dumps, send_event
from appliance.server.schema.responses import (
    DetokenizeResponse,
    HealthResponse,
    ProbeResponse,
    TokenizeResponse,
)
from appliance.server.state import Phase

routes = web.RouteTableDef()
STATS_INTERVAL_S = 0.25


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    """200 {"status": "ok"} when serving; 503 otherwise: "loading" with the phase the engine is
    in ("converting the GGUF file ...", "loading weights", "warming up"), "draining", or
    "error" with the reason (the engine failed to load, or its process died)."""
    state = request.app[STATE]
    status = state.phase.value
    if state.phase is Phase.READY and state.core is not None and not state.core.is_running:
        status = Phase.FAILED.value
    error = state.load_error if status == Phase.FAILED.value else None
    phase = state.loading_words if state.phase is Phase.LOADING else None
    body = HealthResponse(status=status, phase=phase, error=error or None)
    return web.json_response(
        body.model_dump(exclude_none=True), status=200 if status == "ok" else 503
    )


@routes.get("/health/live")
async def health_live(request: web.Request) -> web.Response:
    """Liveness: 200 while this process runs its event loop (this answer is the proof) and
    its engine core is alive or still loading; 503 once the core is gone or failed to load, so
    that an orchestrator restarts the server. Loading and draining are alive."""
    return _probe(request.app[STATE].liveness())


@routes.get("/health/ready")
async def health_ready(request: web.Request) -> web.Response:
    """Readiness: 200 only when the engine is loaded and warmed up and the server is not
    draining; 503 with the reason ("loading", "warming up", "draining", "engine core gone",
    "engine failed to load") otherwise."""
    return _probe(request.app[STATE].readiness())


def _probe(reason: str | None) -> web.Response:
    body = ProbeResponse(status="ok" if reason is None else "unavailable", reason=reason)
    return web.json_response(
        body.model_dump(exclude_none=True), status=200 if reason is None else 503
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.Response:
    ensure_ready(request)
    data = await read_json(request)
    prompt, messages, add_special = parse_tokenize(data)
    async with model_state(request, data.get("model")) as state:
        engine = state.engine
    if messages is not None:
        size = sum(len(m["content"]) for m in messages)
        try:
            tokens = await offload(request.app, partial(engine.apply_chat_template, messages), size)
        except ValueError as exc:
            raise APIError(
                400, f"cannot apply the chat template: {exc}", param="messages"
            ) from None
    else:
        encode = partial(engine.encode, prompt, add_special_tokens=add_special)
        tokens = await offload(request.app, encode, len(prompt))
    body = TokenizeResponse(
        tokens=tokens, count=len(tokens), max_model_len=engine.config.max_model_len
    )
    return web.json_response(body.model_dump())


@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.Response:
    ensure_ready(request)
    data = await read_json(request)
    async with model_state(request, data.get("model")) as state:
        tokens = parse_detokenize(data, state.engine.vocab_size)
        try:
            text = state.engine.decode(tokens)
        except ValueError as exc:
            raise APIError(400, str(exc), param="tokens") from None
    body = DetokenizeResponse(prompt=text)
    return web.json_response(body.model_dump())


@routes.get("/v1/stats")
async def stats(request: web.Request) -> web.Response:
    snapshot = request.app[TRACKER].snapshot(request.app[STATE])
    return web.json_response(snapshot, dumps=dumps)


@routes.get("/v1/stats/stream")
async def stats_stream(request: web.Request) -> web.StreamResponse:
    """The /v1/stats document as Server-Sent Events, about four times a second."""
    app = request.app
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    try:
        while True:
            await send_event(resp, app[TRACKER].snapshot(app[STATE]))
            await asyncio.sleep(STATS_INTERVAL_S)
    except ConnectionResetError:
        pass
    return resp


@routes.get("/v1/requests/{request_id}")
async def request_trace(request: web.Request) -> web.Response:
    rid = request.match_info["request_id"]
    record = request.app[TRACKER].records.get(rid)
    if record is None:
        raise APIError(
            404, f"no recent request with id {rid!r}", param="request_id", code="request_not_found"
        )
    return web.json_response(record.trace(), dumps=dumps)


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_spec(request.app[STATE].settings.web))
