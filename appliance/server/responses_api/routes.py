"""POST /v1/responses (whole or streamed), GET and DELETE /v1/responses/{response_id}."""

from __future__ import annotations

import json
from contextlib import aclosing
from dataclasses import dataclass

from aiohttp import web

from appliance.key_limits import ANONYMOUS
from appliance.server.body import read_json
from appliance.server.chat_output import ChatOutput
from appliance.server.errors import APIError, bad_request
from appliance.server.generation import Choice, Generation
from appliance.server.model_route import request_state, served_name
from appliance.server.openai_routes import SSE_HEADERS, offload, serve_generation
from appliance.server.protocol import GenerateRequest
from appliance.server.records import RequestRecord
from appliance.server.request_keys import CLIENT_GONE, KEY_NAME
from appliance.server.responses import dumps
from appliance.server.responses_api.convert import Parsed, parse_responses, renamed
from appliance.server.responses_api.events import OutputStream, Sequencer, new_id
from appliance.server.responses_api.objects import ResponseHead, response_object, usage
from appliance.server.responses_api.store import ResponseStore

routes = web.RouteTableDef()
RESPONSE_STORE = web.AppKey("response_store", ResponseStore)


@dataclass
class Run:
    """A started generation of one choice, how its chat text is read, and `outcome`: what the
    request's record closes with (status, HTTP status, error), set as the answer ends."""

    gen: Generation
    output: ChatOutput
    outcome: list

    @property
    def choice(self) -> Choice:
        return self.gen.choices[0]

    @property
    def record(self) -> RequestRecord:
        return self.gen.record


def _owner(request: web.Request) -> str:
    return request.get(KEY_NAME) or ANONYMOUS


def _not_found(response_id: str) -> APIError:
    return APIError(
        404, f"No response found with id '{response_id}'", param="response_id", code="not_found"
    )


@routes.post("/v1/responses")
async def create_response(request: web.Request) -> web.StreamResponse:
    data = await read_json(request)
    store = request.app[RESPONSE_STORE]

    def history(response_id: str) -> list[dict]:
        stored = store.get(_owner(request), response_id)
        if stored is None:
            raise bad_request(
                f"Previous response with id '{response_id}' not found (responses are kept in "
                "memory, per API key, until a restart or until newer ones take their room)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return stored.conversation

    parsed = parse_responses(data, history)
    head = ResponseHead(new_id("resp"), served_name(request, parsed.generate.model), parsed.body)

    async def reply(
        request: web.Request,
        req: GenerateRequest,
        gen: Generation,
        output: ChatOutput | None,
        outcome: list,
    ) -> web.StreamResponse:
        run = Run(gen, output, outcome)
        if parsed.body.stream:
            return await _stream(request, run, parsed, head)
        async with aclosing(gen.outputs()) as outputs:
            async for _ in outputs:
                pass
        out = OutputStream()
        chat = output.stream()
        last = run.choice.last
        out.feed((chat.feed(last.text) if last is not None and last.text else []) + chat.finish())
        complete = run.choice.record.finish_reason != "length"
        out.finish(complete)
        body = await _final(request, run, head, out, complete)
        outcome[:] = ["finished", 200, None]
        _keep(request, parsed, body)
        return web.json_response(body, dumps=dumps)

    try:  # the chat path's checks name chat fields; a Responses client gets its own names
        return await serve_generation(request, parsed.generate, reply)
    except APIError as err:
        raise renamed(err) from None


async def _final(
    request: web.Request, run: Run, head: ResponseHead, out: OutputStream, complete: bool
) -> dict:
    """The finished response object, with its usage (reasoning tokens counted by the
    tokenizer on the reasoning text)."""
    record = run.record
    thought = "".join(
        part["text"]
        for item in out.items
        if item["type"] == "reasoning"
        for part in item["content"]
    )
    reasoning = 0
    if thought:
        encode = request_state(request).engine.encode
        ids = await offload(request.app, lambda: encode(thought, False), len(thought))
        reasoning = min(len(ids), record.completion_tokens)
    u = usage(record.prompt_tokens, record.completion_tokens, record.cached_tokens, reasoning)
    status = "completed" if complete else "incomplete"
    return response_object(head, status, out.items, u)


def _keep(request: web.Request, parsed: Parsed, body: dict) -> None:
    if parsed.body.store:
        conversation = [*parsed.items, *body["output"]]
        request.app[RESPONSE_STORE].put(_owner(request), body, conversation)


async def _send(resp: web.StreamResponse, event: dict) -> None:
    await resp.write(f"event: {event['type']}\ndata: {dumps(event)}\n\n".encode())


async def _stream(
    request: web.Request, run: Run, parsed: Parsed, head: ResponseHead
) -> web.StreamResponse:
    """The Responses API's events; an error after the headers sends `error` and then
    `response.failed`."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    seq, out, chat = Sequencer(), OutputStream(), run.output.stream()
    started = response_object(head, "in_progress", [])
    try:
        await _send(resp, seq({"type": "response.created", "response": started}))
        await _send(resp, seq({"type": "response.in_progress", "response": started}))
        try:
            async with aclosing(run.gen.outputs()) as outputs:
                async for choice, output in outputs:
                    text = output.text[choice.sent_text :]
                    choice.sent_text = len(output.text)
                    deltas = chat.feed(text) if text else []
                    if output.finished:
                        deltas += chat.finish()
                    for event in out.feed(deltas):
                        await _send(resp, seq(event))
            complete = run.choice.record.finish_reason != "length"
            for event in out.finish(complete):
                await _send(resp, seq(event))
            body = await _final(request, run, head, out, complete)
            kind = "response.completed" if complete else "response.incomplete"
            await _send(resp, seq({"type": kind, "response": body}))
            run.outcome[:] = ["finished", 200, None]
            _keep(request, parsed, body)
        except APIError as err:
            code = err.code or err.type
            error = {"type": "error", "code": code, "message": err.message, "param": err.param}
            await _send(resp, seq(error))
            reason = {"code": code, "message": err.message}
            failed = response_object(head, "failed", out.items, None, reason)
            await _send(resp, seq({"type": "response.failed", "response": failed}))
            status = "timeout" if err.status == 504 else "error"
            run.outcome[:] = [status, err.status, f"{code}: {err.message}"]
        await resp.write_eof()
    except ConnectionResetError:
        run.outcome[:] = ["cancelled", 499, "client disconnected"]
        request[CLIENT_GONE] = True
    return resp


@routes.get("/v1/responses/{response_id}")
async def get_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    stored = request.app[RESPONSE_STORE].get(_owner(request), response_id)
    if stored is None:
        raise _not_found(response_id)
    return web.Response(text=json.dumps(stored.response), content_type="application/json")


@routes.delete("/v1/responses/{response_id}")
async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if not request.app[RESPONSE_STORE].delete(_owner(request), response_id):
        raise _not_found(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


def setup(app: web.Application) -> None:
    """Add the routes and the (empty) response store to an app."""
    app[RESPONSE_STORE] = ResponseStore()
    app.router.add_routes(routes)
