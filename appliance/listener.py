"""Binding an HTTP front end: the TLS context, the listening socket (shared by the API
workers through SO_REUSEPORT), the URL it answers at, and the log format and grace period
that the main front end and the API workers share."""

from __future__ import annotations

import ssl
import sys

from aiohttp import web

from appliance.server.app_runner import AppRunner
from appliance.settings import ServeSettings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ENGINE_GONE_GRACE_S = 1.0
"""How long the server keeps answering once the engine died or failed to load: the answers on
their way go out, and /health says why to whoever polls it."""


def make_ssl_context(settings: ServeSettings) -> ssl.SSLContext | None:
    if not settings.ssl_certfile:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    return ctx


def base_url(runner: web.AppRunner, settings: ServeSettings, is_tls: bool) -> str:
    """The listening server's URL: "http://127.0.0.1:8000" (the bound port where it was 0)."""
    scheme = "https" if is_tls else "http"
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    port = runner.addresses[0][1] if runner.addresses else settings.port
    return f"{scheme}://{host}:{port}"


async def listen(
    app: web.Application, settings: ServeSettings, ssl_ctx: ssl.SSLContext | None
) -> web.AppRunner | None:
    """Start listening (before the engine loads, so /health answers 503 meanwhile); None,
    with the reason on stderr, when the address cannot be bound."""
    runner = AppRunner(app, handler_cancellation=True, shutdown_timeout=3.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(
        runner,
        settings.host,
        settings.port,
        ssl_context=ssl_ctx,
        reuse_port=settings.api_workers > 1,  # the API workers bind the same port
    )
    try:
        await site.start()
    except OSError as exc:
        print(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr)
        await runner.cleanup()
        return None
    return runner
