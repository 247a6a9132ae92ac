"""API errors in the OpenAI envelope, and the middleware that turns every failure into one."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from appliance.server.request_keys import REQUEST_ID
from appliance.server.schema.responses import ErrorBody, ErrorResponse

logger = logging.getLogger("appliance.server")

_STATUS_TYPES = {
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
    """An error answered as `{"error": {"message", "type", "param", "code"}}` with `status`."""

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
        self.type = type or _STATUS_TYPES.get(status, "api_error")
        self.param = param
        self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict:
        body = ErrorBody(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=body).model_dump()

    def response(self) -> web.Response:
        return web.json_response(self.to_dict(), status=self.status, headers=self.headers)


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
    else:
        message = exc.reason
    return APIError(status, message, headers={k: v for k, v in exc.headers.items() if k == "Allow"})


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every error leaves as an OpenAI envelope; nothing escapes as an HTML page or a bare 500."""
    try:
        return await handler(request)
    except APIError as err:
        return err.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(exc).response()
    except json.JSONDecodeError as exc:  # defensive: parsers raise APIError themselves
        return bad_request(f"invalid JSON: {exc}").response()
    except ConnectionResetError as exc:
        logger.info("request %s ended early: %r", request.get(REQUEST_ID), exc)
        raise
    except Exception:
        logger.exception("request %s failed", request.get(REQUEST_ID))
        return APIError(500, "internal server error; see the server log").response()
