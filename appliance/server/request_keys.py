"""Typed keys of the per-request values the middlewares set (id, arrival time, key name)."""

from __future__ import annotations

from aiohttp import web

REQUEST_ID = web.RequestKey("request_id", str)
"""The request's id: a sane incoming X-Request-Id, else a fresh one."""
RECEIVED_AT = web.RequestKey("received_at", float)
"""time.time() when the request reached the server."""
KEY_NAME = web.RequestKey("key_name", str)
"""Name of the API key the request authenticated with (never the key itself)."""
