"""AppRunner: aiohttp's runner, whose connections answer in the error envelope what never
reaches the app: a request its HTTP parser refuses (a malformed request line or header, a
duplicated Content-Type or Host, too many headers, a broken Transfer-Encoding), and an
exception that escaped every middleware.

aiohttp answers those itself, as plain text, with a traceback in the log, and has no hook for
them (aio-libs/aiohttp#3287); its connection handler's `handle_error` is the one place that
sees them, so the server here makes its connections of a subclass that overrides it. Client
errors are logged on one line, never with a traceback or the bytes that were sent (a header
may hold an API key).
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod

from appliance.server.errors import APIError, Envelope, http_message, openai_envelope

logger = logging.getLogger("appliance.server")


class EnvelopeRequestHandler(web.RequestHandler):
    """One connection, whose errors outside the app are answered in `envelope`."""

    __slots__ = ("envelope",)

    def __init__(self, manager: web.Server, *, envelope: Envelope, **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self.envelope = envelope

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The parser's refusal (status 400, `exc` its error), a handler that timed out (504)
        or an exception no middleware caught (500), as an error response that closes the
        connection."""
        if status >= 500:  # 500: an escaped exception; 504: a handler's asyncio.TimeoutError
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
            text = "internal server error; see the server log"
            if status == 504:
                text = "the request timed out in the server"
        else:
            error = exc if exc is not None else Exception(message or "")
            text = f"malformed HTTP request: {http_message(error)}"
            # BadHttpMethod: often TLS or other non-HTTP traffic on the port; not worth a line
            level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
            reason = http_message(error, echo=False)
            logger.log(level, "refused a request from %s: %d %s", request.remote, status, reason)
        if request.writer.output_size > 0:  # as aiohttp: the response has begun, drop it
            raise ConnectionError("the response had begun when the request failed")
        body = self.envelope(APIError(status, text))
        response = web.json_response(body, status=status)
        response.force_close()
        return response

    def log_exception(self, *args, **kwargs) -> None:
        """After a response, aiohttp drains what is left of the body and meets a broken one's
        error again (the error middleware has answered it with a 400): no traceback for it."""
        exc = kwargs.get("exc_info")
        if isinstance(exc, web.RequestPayloadError):
            reason = http_message(exc, echo=False)
            logger.debug("dropped the rest of a body that could not be read: %s", reason)
            return
        super().log_exception(*args, **kwargs)


class _Server(web.Server):
    """The app's server, making EnvelopeRequestHandler connections."""

    def __init__(self, *args, envelope: Envelope, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.envelope = envelope

    @classmethod
    def of(cls, server: web.Server, envelope: Envelope) -> _Server:
        """The same server (handler, request factory, settings) with envelope connections."""
        return cls(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            envelope=envelope,
            **server._kwargs,
        )

    def __call__(self) -> EnvelopeRequestHandler:
        return EnvelopeRequestHandler(self, loop=self._loop, envelope=self.envelope, **self._kwargs)


class AppRunner(web.AppRunner):
    """web.AppRunner whose connections answer errors outside the app in `envelope` (OpenAI's:
    such a request matched no route, so no route's envelope applies)."""

    def __init__(
        self, app: web.Application, *, envelope: Envelope = openai_envelope, **kwargs
    ) -> None:
        super().__init__(app, **kwargs)
        self.envelope = envelope

    async def _make_server(self) -> web.Server:
        return _Server.of(await super()._make_server(), self.envelope)
