"""API-key authentication: `Authorization: Bearer KEY` (or `X-Api-Key`), constant-time compare.

Open without a key: /health, /health/live and /health/ready (for probes and load balancers),
/openapi.json, and the web page with its files (it asks for a key and sends it). Keys are never
logged; the matching key's name is stored on the request for logs and traces.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from appliance.server.errors import APIError
from appliance.server.request_keys import KEY_ADMIN, KEY_NAME
from appliance.settings import ApiKey
from appliance.web import PAGE_PATH, STATIC_PREFIX

PUBLIC_PATHS = frozenset({"/health", "/health/live", "/health/ready", "/openapi.json", PAGE_PATH})


def match_key(presented: str, keys: list[ApiKey]) -> ApiKey | None:
    """The key equal to `presented`, comparing against every key in constant time each."""
    found = None
    # aiohttp decodes header bytes that are not UTF-8 as surrogates: compare the bytes as sent
    given = presented.encode("utf-8", "surrogateescape")
    for key in keys:
        if hmac.compare_digest(given, key.key.encode()):
            found = key
    return found


def presented_key(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("X-Api-Key") or None


def make_auth_middleware(keys: list[ApiKey]):
    @web.middleware
    async def auth_middleware(request: web.Request, handler) -> web.StreamResponse:
        if (
            not keys
            or request.path in PUBLIC_PATHS
            or request.path.startswith(STATIC_PREFIX)
            or request.method == "OPTIONS"
        ):
            return await handler(request)
        presented = presented_key(request)
        key = match_key(presented, keys) if presented else None
        if key is None:
            message = (
                "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
                if presented is None
                else "invalid API key"
            )
            raise APIError(
                401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
        request[KEY_NAME] = key.name
        request[KEY_ADMIN] = key.admin
        return await handler(request)

    return auth_middleware
