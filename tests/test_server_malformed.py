"""Input that is not a well-formed request: text that is not valid Unicode anywhere in a body,
HTTP that aiohttp's parser refuses, a body the transport cannot decode, header bytes that are
not UTF-8. Each gets a 4xx in the error envelope, nothing is logged with a traceback, and the
server serves on."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from appliance.server.body import read_json
from appliance.server.errors import APIError, answers_errors_in, error_middleware
from tests.support.fake_server import app_server, fake_client
from tests.test_server_errors import expect_error

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSG = {"role": "user", "content": "w1"}
FUNCTION = {"type": "function", "function": {"name": "f"}}
BAD = "x\ud800"
"""A lone surrogate: json.dumps writes it as the escape "\\ud800", valid JSON and UTF-8."""


@pytest.fixture(scope="module")
def served():
    """(runner, client) on the fake engine, shared by this module's tests."""
    with asyncio.Runner() as runner:
        cm = fake_client()
        client = runner.run(cm.__aenter__())
        try:
            yield runner, client
        finally:
            runner.run(cm.__aexit__(None, None, None))


def _run(served, coro):
    runner, _ = served
    return runner.run(asyncio.wait_for(coro, 10))


async def _post(client, path: str, body: dict):
    return await client.post(path, data=json.dumps(body))


SURROGATES = [
    (CHAT, {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    (
        CHAT,
        {"messages": [MSG, {"role": "user", "content": [{"type": "text", "text": BAD}]}]},
        "messages[1].content[0].text",
    ),
    (CHAT, {"messages": [MSG], "stop": ["ok", BAD]}, "stop[1]"),
    (CHAT, {"messages": [MSG], "regex": BAD}, "regex"),
    (CHAT, {"messages": [MSG], "grammar": BAD + "start"}, "grammar"),
    (CHAT, {"messages": [MSG], "choice": ["a", BAD]}, "choice[1]"),
    (
        CHAT,
        {
            "messages": [MSG],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "string", "pattern": BAD}},
            },
        },
        "response_format.json_schema.schema.pattern",
    ),
    (
        CHAT,
        {"messages": [MSG], "tools": [{**FUNCTION, "function": {"name": "f", "description": BAD}}]},
        "tools[0].function.description",
    ),
    (CHAT, {"messages": [MSG], "chat_template_kwargs": {"x": BAD}}, "chat_template_kwargs.x"),
    (COMPLETIONS, {"prompt": BAD}, "prompt"),
    (COMPLETIONS, {"prompt": ["w1", BAD]}, "prompt[1]"),
    (COMPLETIONS, {"prompt": "w1", "stop": BAD}, "stop"),
    (COMPLETIONS, {"prompt": "w1", "user": BAD}, "user"),
    (COMPLETIONS, {"prompt": "w1", "model": BAD}, "model"),
    ("/tokenize", {"prompt": BAD}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("/detokenize", {"tokens": [1], "model": BAD}, "model"),
]


@pytest.mark.parametrize("path, body, param", SURROGATES, ids=[p for *_, p in SURROGATES])
def test_a_lone_surrogate_in_any_field_is_a_400_naming_it(served, path, body, param):
    _, client = served

    async def check():
        err = await expect_error(await _post(client, path, body), 400, "is not valid Unicode")
        assert err["param"] == param and err["message"].startswith(param), err
        assert "(U+D800) at character 1" in err["message"]
        assert err["type"] == "invalid_request_error"

    _run(served, check())


def test_a_lone_surrogate_in_a_key_names_the_object_holding_it(served):
    _, client = served

    async def check():
        tool = {**FUNCTION, "function": {"name": "f", "parameters": {"properties": {BAD: {}}}}}
        body = {"messages": [MSG], "tools": [tool]}
        err = await expect_error(await _post(client, CHAT, body), 400, "a key of tools[0]")
        assert err["param"] == "tools[0].function.parameters.properties"
        body = {"prompt": "w1", BAD: 1}
        err = await expect_error(await _post(client, COMPLETIONS, body), 400, "a key of the req")
        assert err["param"] is None

    _run(served, check())


def test_a_surrogate_pair_is_one_character_and_welcome(served):
    _, client = served

    async def check():
        raw = b'{"prompt": "w1 \\ud83d\\ude00", "stop": "\\uD83D\\uDE00", "max_tokens": 2}'
        r = await client.post(COMPLETIONS, data=raw)
        assert r.status == 200, await r.text()
        r = await client.post("/tokenize", data=b'{"prompt": "\\u00e9\\ud83d\\ude00"}')
        assert r.status == 200 and (await r.json())["count"] == 1

    _run(served, check())


async def exchange(client, request: bytes) -> tuple[int, dict]:
    """Send raw bytes on a fresh connection; (status, JSON body) of the answer."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    assert headers["Content-Type"].startswith("application/json"), head
    body = await reader.readexactly(int(headers["Content-Length"]))
    writer.close()
    return int(lines[0].split()[1]), json.loads(body)


BODY = b'{"prompt": "w1", "max_tokens": 1}'


def _post_bytes(extra_headers: bytes, body: bytes = BODY, method: bytes = b"POST") -> bytes:
    return (
        method
        + b" /v1/completions HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        + extra_headers
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


JSON = b"Content-Type: application/json\r\n"
MALFORMED = {
    "duplicate Content-Type": (_post_bytes(JSON + JSON), "Duplicate 'Content-Type' header"),
    "duplicate Host": (_post_bytes(b"Host: again\r\n"), "Duplicate 'Host' header"),
    "control character in a header": (_post_bytes(b"X-Note: a\x01b\r\n"), "header value char"),
    "NUL in Content-Type": (_post_bytes(b"Content-Type: a\x00b\r\n"), "header value char"),
    "too many headers": (
        _post_bytes(b"".join(b"X-H%d: 1\r\n" % i for i in range(200))),
        "Too many headers",
    ),
    "header line too long": (_post_bytes(b"X-Long: " + b"a" * 9000 + b"\r\n"), "8190 bytes"),
    "bad method": (_post_bytes(b"", method=b"P@ST"), "Invalid method"),
    "bad HTTP version": (
        b"GET /health HTTP/9.9\r\nHost: test\r\n\r\n",
        "Invalid HTTP version",
    ),
    "bad chunk size": (
        b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nabc\r\n0\r\n\r\n",
        "chunk size",
    ),
    "Content-Length with Transfer-Encoding": (
        _post_bytes(b"Transfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
        "can't be present with",
    ),
    "bad Content-Length": (
        b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Length: -5\r\n\r\n",
        "Content-Length",
    ),
    "byte 0xff in the path": (b"GET /v1/\xff HTTP/1.1\r\nHost: test\r\n\r\n", "url path"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_http_the_parser_refuses_is_a_400_in_the_envelope_without_a_traceback(served, caplog, name):
    _, client = served
    request, fragment = MALFORMED[name]
    caplog.set_level(logging.DEBUG)
    status, body = _run(served, exchange(client, request))
    assert status == 400, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"].startswith("malformed HTTP request: ") and fragment in err["message"]
    assert err["type"] == "invalid_request_error"
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "aaaaaaaa" not in caplog.text and "a\\x01b" not in caplog.text  # bytes not logged
    status, _ = _run(served, exchange(client, _post_bytes(JSON)))
    assert status == 200


def test_a_body_that_cannot_be_decoded_is_a_400_and_a_bomb_a_413(caplog):
    async def check():
        async with fake_client(max_body_bytes=100_000) as client:
            headers = b"Content-Encoding: gzip\r\n"
            status, body = await exchange(client, _post_bytes(headers, b"not gzip"))
            assert status == 400, body
            assert "could not be read: Can not decode content-encoding: gzip" in str(body)
            bomb = gzip.compress(b" " * 10_000_000)
            status, body = await exchange(client, _post_bytes(headers, bomb))
            assert status == 413 and body["error"]["type"] == "request_too_large", body
            await asyncio.sleep(0.1)  # aiohttp drains what is left of a body after answering
            status, _ = await exchange(client, _post_bytes(JSON))
            assert status == 200

    caplog.set_level(logging.DEBUG)
    asyncio.run(check())
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def test_an_api_key_header_that_is_not_utf8_is_refused_not_a_500(caplog):
    async def check():
        async with fake_client(api_key=["ops:sk-ops-0123456789"]) as client:
            for header in (b"Authorization: Bearer sk-\xff\xfe", b"X-Api-Key: sk-\xe4"):
                request = b"GET /v1/stats HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s\r\n\r\n"
                status, body = await exchange(client, request % header)
                assert status == 401 and body["error"]["message"] == "invalid API key"

    asyncio.run(check())
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def other_envelope(err: APIError) -> dict:
    return {"type": "error", "error": {"type": err.type, "message": err.message}}


async def test_each_route_answers_in_its_envelope_and_reads_bodies_the_one_way():
    """A route marked with another API's envelope writes the body reader's refusals and its own
    errors in that envelope; unmarked routes and unknown paths keep OpenAI's."""

    @answers_errors_in(other_envelope)
    async def other(request: web.Request) -> web.Response:
        data = await read_json(request)
        raise APIError(409, f"saw {sorted(data)}")

    async def openai_style(request: web.Request) -> web.Response:
        return web.json_response(await read_json(request))

    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/other", other)
    app.router.add_post("/openai", openai_style)
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/other", data=b'{"a": "\\udc00"}')
        body = await r.json()
        assert r.status == 400 and set(body) == {"type", "error"}, body
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith("a is not valid Unicode")
        r = await client.post("/other", data=b'{"b": 1}')
        assert r.status == 409 and (await r.json())["error"]["message"] == "saw ['b']"
        r = await client.post("/openai", data=b'{"a": "\\udc00"}')
        await expect_error(r, 400, "a is not valid Unicode")
        await expect_error(await client.get("/nowhere"), 404, "no such route")


async def test_an_exception_outside_every_middleware_is_a_500_in_the_envelope(caplog):
    """What escapes the error middleware (here a middleware outside it fails) reaches the
    connection's own handler: a 500 in the envelope, logged with its traceback."""

    @web.middleware
    async def broken(request: web.Request, handler):
        raise RuntimeError("a bug outside the error middleware")

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application(middlewares=[broken, error_middleware])
    app.router.add_get("/ok", ok)
    async with TestClient(app_server(app)) as client:
        r = await client.get("/ok")
        err = await expect_error(r, 500, "internal server error", type_="internal_server_error")
        assert err["param"] is None
    assert "a bug outside the error middleware" in caplog.text
