"""The web page's routes: GET / (the page) and GET /web/{path} (its files from
appliance/web/static), each with a Content-Security-Policy that lets only the page's own files
run, and GET /v1/key (what the page's key may see). Off with --no-web. The page and its files
are open without an API key (auth.py): the page holds no data, it asks for a key and sends it
with every API call."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from appliance.server.app_keys import STATE
from appliance.server.errors import APIError
from appliance.server.request_keys import KEY_ADMIN, KEY_NAME
from appliance.web import PAGE_PATH, STATIC_DIR, STATIC_PREFIX

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",  # the page's own module files: no inline script, no eval
        "style-src 'self'",
        "img-src 'self' data:",  # a model's Markdown image never reaches another host
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate: an upgraded appliance serves its new files
}
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
}
"""The files the page is made of, by suffix; any other file (a licence) is plain text."""
TEXT = "text/plain; charset=utf-8"
KEY_PATH = "/v1/key"


def _file(path: Path) -> web.FileResponse:
    headers = {**PAGE_HEADERS, "Content-Type": CONTENT_TYPES.get(path.suffix, TEXT)}
    return web.FileResponse(path, headers=headers)


async def page(request: web.Request) -> web.FileResponse:
    return _file(STATIC_DIR / "index.html")


async def static_file(request: web.Request) -> web.FileResponse:
    root = STATIC_DIR.resolve()
    path = (root / request.match_info["path"]).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise APIError(404, f"no file {request.path}", code="not_found")
    return _file(path)


async def key_info(request: web.Request) -> web.Response:
    """{"auth": the server wants API keys, "name": the key's name or null, "admin": it is an
    admin key (--admin-key; false when the server has no keys)}. Behind auth like the API, so
    a wrong key answers 401. The page shows usage by key only to an admin key."""
    auth = bool(request.app[STATE].settings.api_keys)
    admin = auth and bool(request.get(KEY_ADMIN))
    return web.json_response({"auth": auth, "name": request.get(KEY_NAME), "admin": admin})


def setup_web(app: web.Application) -> None:
    """Serve the page at PAGE_PATH, its files under STATIC_PREFIX and KEY_PATH."""
    app.router.add_get(PAGE_PATH, page)
    app.router.add_get(KEY_PATH, key_info)
    app.router.add_get(STATIC_PREFIX + "{path:.+}", static_file)
