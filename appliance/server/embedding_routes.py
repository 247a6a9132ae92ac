"""POST /v1/embeddings and /v1/rerank: pooling requests through the one admission path (key
limits, queue cap, the engine's request streams), answered in OpenAI's and vLLM's shapes."""

from __future__ import annotations

import asyncio
import uuid
from functools import partial

from aiohttp import web

from appliance.key_limits import ANONYMOUS
from appliance.server.app_keys import LIMITER, TRACKER
from appliance.server.body import read_json
from appliance.server.errors import APIError
from appliance.server.generation import Choice, Generation
from appliance.server.limits import Refusal
from appliance.server.model_route import model_state, require_kind
from appliance.server.openai_routes import admit, count_rejected, offload, refused
from appliance.server.pooling_inputs import (
    check_dimensions,
    parse_embeddings,
    parse_rerank,
    shape_embedding,
)
from appliance.server.records import ChoiceRecord, RequestRecord
from appliance.server.request_keys import KEY_NAME, RECEIVED_AT, REQUEST_ID
from appliance.server.responses import dumps
from engine.sampling_params import SamplingParams
from engine.text.rerank_prompt import rerank_token_ids

routes = web.RouteTableDef()


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    body = parse_embeddings(await read_json(request))
    async with model_state(request, body.model) as state:
        return await _embeddings(request, body, state)


async def _embeddings(request: web.Request, body, state) -> web.Response:
    require_kind(state, "embed", "/v1/embeddings")
    check_dimensions(body.dimensions, state.engine.embedding_size)
    prompts = [await _encode(request, state, x) for x in body.inputs]
    outputs = await run_pooling(request, state, "embeddings", prompts, "embed")
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": shape_embedding(out.pooled, body.dimensions, body.encoding_format),
        }
        for i, out in enumerate(outputs)
    ]
    total = sum(map(len, prompts))
    answer = {
        "object": "list",
        "data": data,
        "model": state.model_name,
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }
    return web.json_response(answer, dumps=dumps)


@routes.post("/v1/rerank")
async def rerank(request: web.Request) -> web.Response:
    body = parse_rerank(await read_json(request))
    async with model_state(request, body.model) as state:
        return await _rerank(request, body, state)


async def _rerank(request: web.Request, body, state) -> web.Response:
    require_kind(state, "rerank", "/v1/rerank")
    engine = state.engine
    encode = partial(rerank_token_ids, engine.tokenizer, body.query)
    prompts = []
    for doc in body.documents:
        pair = partial(encode, doc, body.instruction, engine.is_encoder)
        try:
            prompts.append(await offload(request.app, pair, len(body.query) + len(doc)))
        except ValueError as exc:
            raise APIError(400, f"cannot tokenize the input: {exc}", param="documents") from None
    outputs = await run_pooling(request, state, "rerank", prompts, "score")
    results = [
        {
            "index": i,
            "relevance_score": out.pooled[0],
            **({"document": {"text": body.documents[i]}} if body.return_documents else {}),
        }
        for i, out in enumerate(outputs)
    ]
    results.sort(key=lambda r: -r["relevance_score"])
    answer = {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": state.model_name,
        "results": results[: body.top_n],
        "usage": {"total_tokens": sum(map(len, prompts))},
    }
    return web.json_response(answer, dumps=dumps)


async def _encode(request: web.Request, state, value: str | list[int]) -> list[int]:
    if isinstance(value, list):
        return value
    engine = state.engine
    try:
        return await offload(request.app, partial(engine.encode, value), len(value))
    except ValueError as exc:
        raise APIError(400, f"cannot tokenize the input: {exc}", param="input") from None


async def run_pooling(
    request: web.Request, state, endpoint: str, prompts: list[list[int]], task: str
):
    """Run one pooling request per prompt (key limits, admission, the engine); their final
    outputs in prompt order. The engine's refusal of a prompt (too long, a token id outside
    the vocabulary) is a 400."""
    app = request.app
    tracker, limiter = app[TRACKER], app[LIMITER]
    key_name = request.get(KEY_NAME)
    try:
        limiter.check(key_name or ANONYMOUS, tracker.mean_e2e())
    except Refusal as refusal:
        count_rejected(request)
        raise refused(refusal) from None
    most = state.engine.config.max_num_seqs + state.settings.max_queue
    if len(prompts) > most:  # a 429 would never clear: the queue cannot hold them at once
        raise APIError(
            400,
            f"the request has {len(prompts)} inputs; this server takes at most {most} per "
            "request (max_num_seqs + max_queue): split it",
            param="input" if endpoint == "embeddings" else "documents",
        )
    rid = state.unique_id(request[REQUEST_ID])
    request[REQUEST_ID] = rid
    params = SamplingParams(max_tokens=1, pooling=task, client=key_name)
    choices = []
    for i, ids in enumerate(prompts):
        engine_id = rid if len(prompts) == 1 else f"{rid}-{i}"
        choices.append(Choice(ChoiceRecord(i, engine_id, i, len(ids)), ids, params))
    entry, ticket = admit(request, [c.engine_id for c in choices], sum(map(len, prompts)))
    record = RequestRecord(
        rid, endpoint, state.model_name, key_name, received_at=request[RECEIVED_AT]
    )
    record.choices = [c.record for c in choices]
    record.events.append({"time": record.received_at, "event": "received"})
    tracker.add(record)
    tracker.keys.admitted(key_name, record.model)
    gen = Generation(state.core, state.settings, record, entry, choices)
    outcome = ["error", 500, None]
    final = {}
    try:
        await gen.start()
        async for choice, output in gen.outputs():
            if output.finished:
                final[choice.record.index] = output
        if any(out.pooled is None for out in final.values()):
            raise APIError(503, "the engine stopped the request before its prefill ended")
        outcome[:] = ["finished", 200, None]
        return [final[i] for i in range(len(prompts))]
    except APIError as err:
        outcome[:] = ["error", err.status, err.message]
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        outcome[:] = ["cancelled", 499, "client disconnected"]
        raise
    finally:
        gen.abort_unfinished()
        state.release(entry)
        ticket.release(0)
        record.close(*outcome)
        tracker.finish(record)
