"""The web page's routes: GET / (the page) and GET /web/{path} (its files from
appliance/web/static), each with a Content-Security-Policy that lets only the page's own files
run. Off with --no-web. Open without an API key (auth.py): the page holds no data, it asks for a
key and sends it with every API call."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from appliance.server.errors import APIError
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


def setup_web(app: web.Application) -> None:
    """Serve the page at PAGE_PATH and its files under STATIC_PREFIX."""
    app.router.add_get(PAGE_PATH, page)
    app.router.add_get(STATIC_PREFIX + "{path:.+}", static_file)
