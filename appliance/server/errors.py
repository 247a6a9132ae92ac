"""API errors, the envelope each route writes them in (OpenAI's by default), and the middleware
that turns every failure in a handler into one."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from appliance.server.request_keys import REQUEST_ID
from appliance.server.schema.responses import ErrorBody, ErrorResponse

logger = logging.getLogger("appliance.server")
_ECHOED = re.compile(r":?\s*(?:bytearray\()?\bb['\"].*", re.S)
"""Where aiohttp's parser errors start quoting the request's bytes (b'...')."""

STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """An error answered with `status`, in the envelope of the route that failed (OpenAI's
    `{"error": {"message", "type", "param", "code"}}` unless the route chose another)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or STATUS_TYPES.get(status, "api_error")
        self.param = param
        self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict:
        """The OpenAI envelope (also the error event that ends an OpenAI stream)."""
        return openai_envelope(self)

    def response(self, envelope: Envelope | None = None) -> web.Response:
        body = (envelope or openai_envelope)(self)
        return web.json_response(body, status=self.status, headers=self.headers)


Envelope = Callable[[APIError], dict]
"""How a group of routes writes an error's body. The OpenAI routes (and every error no route
claims: an unknown path, a request the HTTP parser refuses) use `openai_envelope`; routes of
another API mark their handlers with `answers_errors_in` to write that API's own."""


def openai_envelope(err: APIError) -> dict:
    """`{"error": {"message", "type", "param", "code"}}`."""
    body = ErrorBody(message=err.message, type=err.type, param=err.param, code=err.code)
    return ErrorResponse(error=body).model_dump()


def answers_errors_in(envelope: Envelope):
    """Decorator for a route handler: its errors (the body reader's and its own) are written in
    `envelope`. A route group marks each of its handlers."""

    def mark(handler):
        handler.error_envelope = envelope
        return handler

    return mark


def envelope_for(request: web.Request) -> Envelope:
    """The envelope of the route `request` matched; OpenAI's where none matched or chose."""
    return getattr(request.match_info.handler, "error_envelope", openai_envelope)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def timeout_error(kind: str, seconds: float) -> APIError:
    """kind: ttft_timeout, request_timeout or stall_timeout; each is its own error type."""
    what = {
        "ttft_timeout": "no first token within",
        "request_timeout": "the request did not finish within",
        "stall_timeout": "no new token for",
    }[kind]
    return APIError(
        504, f"{what} {seconds:g} s ({kind.replace('_', ' ')})", type=f"{kind}_error", code=kind
    )


def _from_http_exception(exc: web.HTTPException) -> APIError:
    status = exc.status
    if status == 404:
        message = "no such route; see GET /openapi.json for the routes this server has"
    elif status == 405:
        allowed = exc.headers.get("Allow", "").replace(",", ", ")
        message = f"method {getattr(exc, 'method', '')} not allowed here; allowed: {allowed}"
    elif status == 413:
        message = f"request body too large ({exc.text.strip() or 'over the limit'})"
    elif exc.text and exc.text != f"{status}: {exc.reason}":
        message = exc.text
    else:
        message = exc.reason
    return APIError(status, message, headers={k: v for k, v in exc.headers.items() if k == "Allow"})


def http_message(exc: BaseException, *, echo: bool = True) -> str:
    """What aiohttp's HTTP parser says is wrong, on one line, without the caret line that points
    into the bytes it echoes; without those bytes too unless `echo` (logs leave them out: a
    header may hold an API key). A payload error carries the parser's error as its cause."""
    cause = exc if isinstance(exc, HttpProcessingError) else exc.__cause__
    text = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
    lines = [line.strip() for line in str(text).splitlines()]
    text = " ".join(line for line in lines if line and set(line) != {"^"})
    return (text if echo else _ECHOED.sub("", text)) or "malformed"


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every error leaves in the route's envelope; nothing escapes as an HTML page or a bare
    500. Client errors are logged without a traceback (the request id middleware logs the
    status); server errors with one."""
    try:
        return await handler(request)
    except APIError as err:
        return err.response(envelope_for(request))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(exc).response(envelope_for(request))
    except web.RequestPayloadError as exc:  # a broken chunked or compressed encoding
        error = bad_request(f"the request body could not be read: {http_message(exc)}")
        return error.response(envelope_for(request))
    except json.JSONDecodeError as exc:  # defensive: parsers raise APIError themselves
        return bad_request(f"invalid JSON: {exc}").response(envelope_for(request))
    except ConnectionResetError as exc:
        logger.info("request %s ended early: %r", request.get(REQUEST_ID), exc)
        raise
    except Exception:
        logger.exception("request %s failed", request.get(REQUEST_ID))
        error = APIError(500, "internal server error; see the server log")
        return error.response(envelope_for(request))
