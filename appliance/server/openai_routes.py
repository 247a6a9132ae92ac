"""OpenAI-compatible routes: /v1/completions and /v1/chat/completions (with SSE)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from functools import partial

from aiohttp import web

from appliance.key_limits import ANONYMOUS, KeyLimits
from appliance.server.app_keys import EXECUTOR, LIMITER, METRICS, TRACKER
from appliance.server.body import read_json
from appliance.server.chat_output import ChatOutput
from appliance.server.errors import APIError, bad_request
from appliance.server.generation import Choice, Generation
from appliance.server.image_inputs import image_prompt
from appliance.server.limits import Refusal, capped_max_tokens
from appliance.server.model_route import model_state, request_state, require_kind
from appliance.server.protocol import (
    GenerateRequest,
    apply_defaults,
    effective_params,
    parse_chat,
    parse_completion,
)
from appliance.server.records import ChoiceRecord, RequestRecord
from appliance.server.request_grammar import (
    DEFAULT_TOOL_FORMAT,
    REASONING_OPEN,
    after_reasoning,
    forced_tools_spec,
    param_of,
    special_literal,
)
from appliance.server.request_keys import (
    CLIENT_GONE,
    KEY_NAME,
    RATE_LIMIT_HEADERS,
    RECEIVED_AT,
    REQUEST_ID,
)
from appliance.server.responses import Formatter, dumps, send_event, usage
from appliance.server.state import ServerState
from appliance.server.tools import parser_for
from appliance.server.tools.grammar import arguments_schema
from engine.structured import StructuredOutput

routes = web.RouteTableDef()
OFFLOAD_CHARS = 2048
"""Prompts longer than this are tokenized in a worker thread, not on the event loop."""
SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    return await serve_generation(request, parse_completion(await read_json(request)))


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await serve_generation(request, parse_chat(await read_json(request)))


async def offload(app: web.Application, fn, size: int):
    """Run fn in the tokenizer pool when the input is large, inline when it is small."""
    if size < OFFLOAD_CHARS:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(app[EXECUTOR], fn)


async def prompt_ids(app: web.Application, state: ServerState, req: GenerateRequest) -> list:
    """The token ids of each prompt of a request: its chat rendered by the model's template (its
    images through the model's processor, setting req.image_inputs), or its completion
    prompts."""
    engine = state.engine
    if req.images:
        return [await image_prompt(app, state, req)]
    if req.messages is not None:
        size = sum(len(m["content"]) for m in req.messages)
        try:
            render = partial(
                engine.apply_chat_template, req.messages, req.tools, req.template_kwargs
            )
            return [await offload(app, render, size)]
        except ValueError as exc:
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None
    return [
        p if isinstance(p, list) else await offload(app, partial(engine.encode, p), len(p))
        for p in req.prompts
    ]


def chat_output(state: ServerState, req: GenerateRequest, prompt_ids: list[int]) -> ChatOutput:
    """How this chat request's output is read: reasoning when the template has `<think>`
    (starting inside it when the rendered prompt ends with an open one), tool calls by the
    model's parser when the request sent tools."""
    engine = state.engine
    template = getattr(engine.tokenizer, "chat_template", None) or ""
    reasoning = REASONING_OPEN in template
    opened = reasoning and engine.decode(prompt_ids[-8:]).rstrip().endswith(REASONING_OPEN)
    parser = None
    forced = bool(req.tools) and req.tool_choice in ("required", "function")
    if req.tools:
        parser = parser_for(template, engine.model_type, state.settings.tool_parser)
        if parser is None and forced:
            parser = DEFAULT_TOOL_FORMAT  # a forced call needs some markup: this one is parsed
    return ChatOutput(reasoning, opened, parser, req.parallel_tool_calls, forced)


async def constrain(state: ServerState, req: GenerateRequest, output: ChatOutput | None):
    """Settle the request's grammar (a forced tool call's, after reasoning where the model
    reasons) and compile it once: (label for the record, compile seconds), or None when the
    output is free. A grammar the library cannot take is a 400 here."""
    forced = None
    if output is not None:
        literal = special_literal(state.engine.tokenizer)
        forced = forced_tools_spec(req, output.tool_parser, literal)
    spec = forced or req.structured
    if spec is None:
        return None
    if output is not None and output.reasoning:
        spec = after_reasoning(spec, output.starts_in_reasoning)
    if state.grammar_check is None:
        raise bad_request("structured outputs need the model's tokenizer, and this model has none")
    param = param_of(spec, forced is not None)
    await state.grammar_check.ready(param)
    if forced is not None:  # name the function whose parameters the library refuses
        for i, tool in enumerate(req.tools):
            function = tool["function"]
            schema = StructuredOutput.json_schema(arguments_schema(function.get("parameters")))
            subject = f"the parameters of {function['name']!r}"
            await state.grammar_check.check(schema, f"tools[{i}].function.parameters", subject)
    seconds = await state.grammar_check.check(spec, param)
    req.structured = spec
    return ("tool_call" if forced is not None else spec.kind), seconds


def refused(refusal: Refusal) -> APIError:
    """A key limit's refusal as the OpenAI error it is answered with."""
    return APIError(
        refusal.status,
        refusal.message,
        param=refusal.param,
        code=refusal.code,
        headers=refusal.headers,
    )


def resolve_max_tokens(
    req: GenerateRequest, prompt_len: int, limit: int, caps: KeyLimits | None = None
) -> int:
    """The request's own max_tokens, checked against the key's caps and the context; else a
    default cut to the key's caps: the override's or the model's (also cut to the rest of the
    context), 16 for completions, the rest of the context for chat."""
    room = max(1, limit - prompt_len)
    own = req.max_tokens if req.sources.get("max_tokens", "request") == "request" else None
    if own is not None and req.max_tokens_fits_context:
        own = min(own, room)
    try:
        wanted = capped_max_tokens(caps or KeyLimits(), own, prompt_len)
    except Refusal as refusal:
        raise refused(refusal) from None
    if own is None:
        default = room if req.max_tokens is None else req.max_tokens
        if req.sources.get("max_tokens") in ("model", "override"):
            default = min(default, room)
        wanted = default if wanted is None else min(wanted, default)
    if prompt_len + wanted > limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens; the request asks for "
            f"{prompt_len + wanted} ({prompt_len} in the prompt, {wanted} to generate)",
            param="max_tokens" if req.max_tokens is not None else "messages",
            code="context_length_exceeded",
        )
    return wanted


async def serve_generation(
    request: web.Request, req: GenerateRequest, reply: Reply | None = None
) -> web.StreamResponse:
    """Run a validated request through the one generation path (checks, key limits, prompt,
    grammar, admission, the engine) and answer it with `reply` (OpenAI's bodies by default).
    With several models, the one `req.model` names serves it (loaded first when needed: the
    wait is part of the request's time to first token)."""
    async with model_state(request, req.model) as state:
        return await _generate(request, req, reply, state)


async def _generate(
    request: web.Request, req: GenerateRequest, reply: Reply | None, state: ServerState
) -> web.StreamResponse:
    app = request.app
    tracker, metrics, limiter = app[TRACKER], app[METRICS], app[LIMITER]
    key_name = request.get(KEY_NAME)
    limits = limiter.limits(key_name or ANONYMOUS)
    require_kind(state, "generate", request.path)
    try:  # a key already past its limits is refused before its prompt costs any work
        limiter.check(key_name or ANONYMOUS, tracker.mean_e2e())
    except Refusal as refusal:
        count_rejected(request)
        raise refused(refusal) from None
    apply_defaults(req, state.defaults)
    prompts = await prompt_ids(app, state, req)
    output = chat_output(state, req, prompts[0]) if req.messages is not None else None
    constraint = await constrain(state, req, output)
    if constraint is not None:
        metrics.observe_structured(*constraint, state.model_name)
    limit = state.engine.config.max_model_len
    max_tokens = [resolve_max_tokens(req, len(ids), limit, limits) for ids in prompts]
    k = len(prompts) * req.n
    if k > state.settings.max_n:
        raise bad_request(
            f"the request asks for {k} choices ({len(prompts)} prompts x n={req.n}); "
            f"this server allows at most {state.settings.max_n}",
            param="n",
        )
    rid = state.unique_id(request[REQUEST_ID])
    request[REQUEST_ID] = rid  # the X-Request-Id header names the trace this request got
    choices = []
    for i in range(k):
        p = i // req.n
        engine_id = rid if k == 1 else f"{rid}-{i}"
        rec = ChoiceRecord(i, engine_id, p, len(prompts[p]))
        params = req.params(i, max_tokens[p], limits.priority, key_name, limits.weight)
        choices.append(Choice(rec, prompts[p], params, images=req.image_inputs))
    entry, ticket = admit(request, [c.engine_id for c in choices], sum(map(len, prompts)))
    record = RequestRecord(
        rid,
        req.endpoint,
        state.model_name,
        key_name,
        req.stream,
        received_at=request[RECEIVED_AT],
    )
    record.choices = [c.record for c in choices]
    record.sampling = effective_params(choices[0].params, req.sources, max_tokens)
    record.tools = bool(req.tools)
    if constraint is not None:
        record.structured, record.grammar_compile_s = constraint
    record.events.append({"time": record.received_at, "event": "received"})
    record.event("admitted", num_choices=k)
    tracker.add(record)
    tracker.keys.admitted(key_name, record.model)

    def on_itl(seconds: float, count: int) -> None:
        tracker.observe_itl(seconds, count)
        metrics.observe_itl(seconds, count, state.model_name)

    gen = Generation(state.core, state.settings, record, entry, choices, on_itl)
    outcome = ["error", 500, None]
    try:
        await gen.start()
        return await (reply or openai_reply)(request, req, gen, output, outcome)
    except APIError as err:
        outcome[:] = ["timeout" if err.status == 504 else "error", err.status, _err(err)]
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        outcome[:] = ["cancelled", 499, "client disconnected"]
        raise
    finally:
        gen.abort_unfinished()
        state.release(entry)
        ticket.release(record.completion_tokens)
        record.close(*outcome)
        tracker.finish(record)


async def openai_reply(
    request: web.Request,
    req: GenerateRequest,
    gen: Generation,
    output: ChatOutput | None,
    outcome: list,
) -> web.StreamResponse:
    """The OpenAI answer of a started generation: the whole body, or its SSE chunks."""
    state, record = request_state(request), gen.record
    fmt = Formatter(
        req.endpoint,
        record.request_id,
        state.model_name,
        int(record.received_at),
        state.engine.tokenizer,
        output,
    )
    if req.stream:
        return await _stream(request, gen, fmt, req, outcome)
    async with aclosing(gen.outputs()) as events:
        async for _ in events:
            pass
    u = usage(record.prompt_tokens, record.completion_tokens, record.cached_tokens)
    body = fmt.full(gen.choices, u)
    outcome[:] = ["finished", 200, None]
    return web.json_response(body, dumps=dumps)


Reply = Callable[
    [web.Request, GenerateRequest, Generation, ChatOutput | None, list],
    Awaitable[web.StreamResponse],
]
"""How an API answers a started generation: (request, req, generation, how its chat text is
read, outcome) -> the response. It consumes `generation.outputs()` and sets `outcome[:]` to
["finished", 200, None] once the answer is complete; serve_generation does the rest."""


def admit(request: web.Request, engine_ids: list[str], prompt_tokens: int):
    """Admit a request past its key's limits, then the server's queue: (InFlight, Ticket), or
    a 429 counted for the key, the server and /metrics. A key's successful admission sets the
    x-ratelimit-* headers its response carries."""
    app = request.app
    state, tracker, limiter = request_state(request), app[TRACKER], app[LIMITER]
    name = request.get(KEY_NAME) or ANONYMOUS
    try:
        ticket = limiter.admit(name, prompt_tokens, tracker.mean_e2e())
        try:
            entry = state.admit(request[REQUEST_ID], engine_ids, tracker.mean_e2e())
        except APIError as err:
            ticket.refund()
            err.headers = {**limiter.headers(name), **err.headers}
            raise
    except (APIError, Refusal) as err:
        count_rejected(request)
        raise refused(err) if isinstance(err, Refusal) else err from None
    request[RATE_LIMIT_HEADERS] = limiter.headers(name)
    return entry, ticket


def count_rejected(request: web.Request) -> None:
    """Count a 429 for the server, its key and /metrics."""
    app = request.app
    model = request_state(request).model_name
    app[TRACKER].rejected(model)
    app[TRACKER].keys.rejected(request.get(KEY_NAME), model)
    app[METRICS].rejected.labels(model).inc()


def _err(err: APIError) -> str:
    return f"{err.code or err.type}: {err.message}"


async def _stream(
    request: web.Request, gen: Generation, fmt: Formatter, req: GenerateRequest, outcome: list
) -> web.StreamResponse:
    """Send the choices as SSE; an error after the headers ends the stream with an error event."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    record = gen.record
    try:
        if fmt.chat:
            for c in gen.choices:
                await send_event(resp, fmt.role_chunk(c.record.index, req.include_usage))
        try:
            async with aclosing(gen.outputs()) as events:
                async for choice, _ in events:
                    for chunk in fmt.delta_chunks(choice, req.include_usage):
                        await send_event(resp, chunk)
            if req.include_usage:
                u = usage(record.prompt_tokens, record.completion_tokens, record.cached_tokens)
                await send_event(resp, fmt.usage_chunk(u))
            outcome[:] = ["finished", 200, None]
        except APIError as err:
            await send_event(resp, err.to_dict())
            outcome[:] = ["timeout" if err.status == 504 else "error", err.status, _err(err)]
        await send_event(resp, "[DONE]")
        await resp.write_eof()
    except ConnectionResetError:
        outcome[:] = ["cancelled", 499, "client disconnected"]
        request[CLIENT_GONE] = True
    return resp
