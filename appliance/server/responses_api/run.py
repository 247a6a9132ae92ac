"""One /v1/responses request on the chat route's generation path: the same limits, template,
tool parser, grammar, admission, engine request, record and metrics (openai_routes), for one
choice, with errors named as the Responses API names its fields."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

from aiohttp import web

from appliance.key_limits import ANONYMOUS
from appliance.server.app_keys import LIMITER, METRICS, STATE, TRACKER
from appliance.server.chat_output import ChatOutput
from appliance.server.errors import APIError, bad_request
from appliance.server.generation import Choice, Generation
from appliance.server.limits import Refusal
from appliance.server.openai_routes import (
    admit,
    chat_output,
    check_model,
    constrain,
    count_rejected,
    offload,
    refused,
    resolve_max_tokens,
)
from appliance.server.protocol import GenerateRequest, apply_defaults, effective_params
from appliance.server.records import ChoiceRecord, RequestRecord
from appliance.server.request_keys import KEY_NAME, RECEIVED_AT, REQUEST_ID
from appliance.server.responses_api.convert import renamed


@dataclass
class Run:
    """A started generation and how its output is read; `outcome` is what the request's
    record closes with (status, HTTP status, error), set by the route as it ends."""

    gen: Generation
    output: ChatOutput
    outcome: list = field(default_factory=lambda: ["error", 500, None])

    @property
    def choice(self) -> Choice:
        return self.gen.choices[0]

    @property
    def record(self) -> RequestRecord:
        return self.gen.record


async def _prompt(app: web.Application, req: GenerateRequest) -> list[int]:
    engine = app[STATE].engine
    size = sum(len(m["content"] or "") for m in req.messages)
    render = partial(engine.apply_chat_template, req.messages, req.tools, req.template_kwargs)
    try:
        return await offload(app, render, size)
    except ValueError as exc:
        raise bad_request(f"cannot apply the chat template: {exc}", "input") from None


@asynccontextmanager
async def generation(request: web.Request, req: GenerateRequest):
    """Admit and start `req` as serve_generation does; yields a Run and, on the way out,
    aborts what is unfinished, releases the admission and closes the record."""
    app = request.app
    state, tracker, metrics, limiter = app[STATE], app[TRACKER], app[METRICS], app[LIMITER]
    state.require_ready()
    key_name = request.get(KEY_NAME)
    limits = limiter.limits(key_name or ANONYMOUS)
    check_model(state, req.model)
    try:  # a key already past its limits is refused before its prompt costs any work
        limiter.check(key_name or ANONYMOUS, tracker.mean_e2e())
    except Refusal as refusal:
        count_rejected(request)
        raise refused(refusal) from None
    apply_defaults(req, state.defaults)
    prompt = await _prompt(app, req)
    output = chat_output(state, req, prompt)
    try:
        constraint = await constrain(state, req, output)
        max_tokens = resolve_max_tokens(req, len(prompt), state.engine.config.max_model_len, limits)
    except APIError as err:
        raise renamed(err) from None
    if constraint is not None:
        metrics.observe_structured(*constraint)
    rid = state.unique_id(request[REQUEST_ID])
    request[REQUEST_ID] = rid
    params = req.params(0, max_tokens, limits.priority, key_name, limits.weight)
    choice = Choice(ChoiceRecord(0, rid, 0, len(prompt)), prompt, params)
    entry, ticket = admit(request, [rid], len(prompt))
    record = RequestRecord(
        rid, req.endpoint, state.model_name, key_name, req.stream, received_at=request[RECEIVED_AT]
    )
    record.choices = [choice.record]
    record.sampling = effective_params(params, req.sources, [max_tokens])
    record.tools = bool(req.tools)
    if constraint is not None:
        record.structured, record.grammar_compile_s = constraint
    record.events.append({"time": record.received_at, "event": "received"})
    record.event("admitted", num_choices=1)
    tracker.add(record)
    tracker.keys.admitted(key_name)

    def on_itl(seconds: float, count: int) -> None:
        tracker.observe_itl(seconds, count)
        metrics.observe_itl(seconds, count)

    run = Run(Generation(state.core, state.settings, record, entry, [choice], on_itl), output)
    try:
        await run.gen.start()
        yield run
    except APIError as err:
        status = "timeout" if err.status == 504 else "error"
        run.outcome[:] = [status, err.status, f"{err.code or err.type}: {err.message}"]
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        run.outcome[:] = ["cancelled", 499, "client disconnected"]
        raise
    finally:
        run.gen.abort_unfinished()
        state.release(entry)
        ticket.release(record.completion_tokens)
        record.close(*run.outcome)
        tracker.finish(record)
