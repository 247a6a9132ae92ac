"""The web page at `/`: a chat view and a live dashboard, static files shipped in the package
(static/: HTML, CSS, JavaScript modules, and the vendored libraries under static/vendor/,
written by `python -m appliance.web.vendor_refresh`). No build step: the browser loads the
files as they are. appliance.server.web_routes serves them."""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
VENDOR_DIR = STATIC_DIR / "vendor"
PAGE_PATH = "/"
"""Where the page is served."""
STATIC_PREFIX = "/web/"
"""Where its files are served: /web/js/chat.js is static/js/chat.js."""
