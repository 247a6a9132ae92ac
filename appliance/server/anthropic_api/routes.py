"""Anthropic's Messages API: POST /v1/messages (whole or as its SSE events) and
/v1/messages/count_tokens, answered from the same generation path as /v1/chat/completions
(openai_routes.serve_generation: key limits, prompt, grammar, admission, engine). Errors on
these routes are written in Anthropic's envelope; `anthropic-version` and `anthropic-beta`
headers are accepted and ignored."""

from __future__ import annotations

from contextlib import aclosing

from aiohttp import web

from appliance.server.anthropic_api.convert import generate_request
from appliance.server.anthropic_api.events import Event, MessageEvents, stop_reason, usage
from appliance.server.anthropic_api.schema import CountTokensRequest, MessagesRequest
from appliance.server.body import read_json
from appliance.server.chat_output import ChatOutput
from appliance.server.errors import STATUS_TYPES, APIError, answers_errors_in
from appliance.server.generation import Choice, Generation
from appliance.server.model_route import ensure_ready, model_state
from appliance.server.openai_routes import SSE_HEADERS, prompt_ids, serve_generation
from appliance.server.protocol import GenerateRequest
from appliance.server.request_keys import CLIENT_GONE
from appliance.server.responses import dumps
from appliance.server.validation import validate

routes = web.RouteTableDef()

ERROR_TYPES = {**STATUS_TYPES, 500: "api_error", 503: "overloaded_error"}
"""Anthropic's error type for a status: OpenAI's names but for these two."""
"""Anthropic's error type for each status; any other is "api_error"."""


def anthropic_envelope(err: APIError) -> dict:
    """`{"type": "error", "error": {"type", "message"}}`."""
    kind = ERROR_TYPES.get(err.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


@routes.post("/v1/messages")
@answers_errors_in(anthropic_envelope)
async def messages(request: web.Request) -> web.StreamResponse:
    body = validate(MessagesRequest, await read_json(request))
    return await serve_generation(request, generate_request(body), reply)


@routes.post("/v1/messages/count_tokens")
@answers_errors_in(anthropic_envelope)
async def count_tokens(request: web.Request) -> web.Response:
    """{"input_tokens": N}: the prompt a Messages request with this body would have."""
    ensure_ready(request)
    body = validate(CountTokensRequest, await read_json(request))
    async with model_state(request, body.model) as state:
        (ids,) = await prompt_ids(request.app, state, generate_request(body))
    return web.json_response({"input_tokens": len(ids)})


def chat_deltas(c: Choice, output: ChatOutput) -> list[dict]:
    """The chat deltas the choice's new text brings (and its end, once finished)."""
    out = c.last
    text = out.text[c.sent_text :]
    c.sent_text = len(out.text)
    if c.chat is None:
        c.chat = output.stream()
    deltas = c.chat.feed(text) if text else []
    return deltas + c.chat.finish() if out.finished else deltas


def _ending(c: Choice, events: MessageEvents, record) -> tuple[tuple[str, str | None], dict]:
    out = c.last
    stop = stop_reason(out.finish_reason, out.stop_reason, events.has_calls)
    return stop, usage(record.prompt_tokens, record.completion_tokens, record.cached_tokens)


async def reply(
    request: web.Request,
    req: GenerateRequest,
    gen: Generation,
    output: ChatOutput | None,
    outcome: list,
) -> web.StreamResponse:
    """The Messages answer of a started generation (one choice): the message, or its events."""
    output = output or ChatOutput()
    record = gen.record
    events = MessageEvents(f"msg_{record.request_id}", req.model)
    if req.stream:
        return await _stream(request, gen, output, events, outcome)
    async with aclosing(gen.outputs()) as outputs:
        async for _ in outputs:
            pass
    (choice,) = gen.choices
    events.feed(chat_deltas(choice, output))
    events.finish(*_ending(choice, events, record))
    outcome[:] = ["finished", 200, None]
    return web.json_response(events.message(), dumps=dumps)


async def send(resp: web.StreamResponse, events: list[Event]) -> None:
    if events:
        text = "".join(f"event: {kind}\ndata: {dumps(data)}\n\n" for kind, data in events)
        await resp.write(text.encode())


async def _stream(
    request: web.Request,
    gen: Generation,
    output: ChatOutput,
    events: MessageEvents,
    outcome: list,
) -> web.StreamResponse:
    """The Messages SSE events; an error after the headers is an `error` event that ends it."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    record = gen.record
    try:
        await send(resp, events.start(usage(record.prompt_tokens, 0, 0)))
        try:
            async with aclosing(gen.outputs()) as outputs:
                async for choice, _ in outputs:
                    await send(resp, events.feed(chat_deltas(choice, output)))
            (choice,) = gen.choices
            await send(resp, events.finish(*_ending(choice, events, record)))
            outcome[:] = ["finished", 200, None]
        except APIError as err:
            await send(resp, [("error", anthropic_envelope(err))])
            kind = "timeout" if err.status == 504 else "error"
            outcome[:] = [kind, err.status, f"{err.code or err.type}: {err.message}"]
        await resp.write_eof()
    except ConnectionResetError:
        outcome[:] = ["cancelled", 499, "client disconnected"]
        request[CLIENT_GONE] = True
    return resp
