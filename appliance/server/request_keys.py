"""Typed keys of per-request values set by middlewares and routes (id, arrival, key, headers,
a client gone before its answer ended)."""

from __future__ import annotations

from aiohttp import web

REQUEST_ID = web.RequestKey("request_id", str)
"""The request's id: a sane incoming X-Request-Id, else a fresh one."""
RECEIVED_AT = web.RequestKey("received_at", float)
"""time.time() when the request reached the server."""
KEY_NAME = web.RequestKey("key_name", str)
"""Name of the API key the request authenticated with (never the key itself)."""
KEY_ADMIN = web.RequestKey("key_admin", bool)
"""The request's API key may load and unload models (--admin-key)."""
RATE_LIMIT_HEADERS = web.RequestKey("rate_limit_headers", dict)
"""The x-ratelimit-* headers of the request's key after its admission (sent on the response)."""
CLIENT_GONE = web.RequestKey("client_gone", bool)
"""The client disconnected before its answer ended (a stream cut short): the access log says
499 instead of the status the response began with."""
