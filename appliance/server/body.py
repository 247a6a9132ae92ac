"""Request bodies: the one reader every route's JSON body goes through. Bytes -> UTF-8 -> JSON
-> an object in which every string, keys included, is valid Unicode; anything else is an
APIError(400) naming the field, written in the route's error envelope. What the transport
cannot deliver (a body over the size limit, a broken chunked or gzip encoding) is raised by
aiohttp while reading and answered by the error middleware."""

from __future__ import annotations

import json
import re

from aiohttp import web

from appliance.server.errors import bad_request
from engine.text.surrogates import find_in_value, json_path

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of U+D800-U+DFFF: the only way a surrogate gets into a body that is valid
UTF-8, so a body without one is not walked."""


async def read_json(request: web.Request) -> dict:
    """The body as a JSON object; 400 for invalid UTF-8, JSON or Unicode (naming the field),
    413 (from aiohttp) when too big."""
    return decode_json(await request.read())


def decode_json(raw: bytes) -> dict:
    """A request body's bytes as a JSON object, or an APIError(400) saying what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"request body is not valid UTF-8 (bad byte at offset {exc.start})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise bad_request("request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(text):  # pairs decode to one character; lone halves stay
        found = find_in_value(data)
        if found is not None:
            message = found.describe(whole="the request body")
            raise bad_request(message, param=json_path(found.path) or None)
    return data
