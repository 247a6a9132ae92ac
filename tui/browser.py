"""`appliance top --web`: the dashboard served to a browser by textual-serve, which runs one
`appliance top` per open page, in a subprocess speaking Textual's web driver. The API key reaches
those subprocesses in the environment (APPLIANCE_TOP_API_KEY), never on a command line."""

from __future__ import annotations

import os
import shlex
import socket
import sys

API_KEY_ENV = "APPLIANCE_TOP_API_KEY"
"""Where `appliance top` reads its API key when --api-key is not given."""
WEB_DRIVER_ENV = "TEXTUAL_DRIVER"
"""Set by textual-serve for the app it runs: that app has no terminal, and needs none."""


def is_web_driven() -> bool:
    """Whether this process is an `appliance top` that textual-serve started."""
    return bool(os.environ.get(WEB_DRIVER_ENV))


def top_command(url: str, verify_tls: bool = True) -> str:
    """The shell command textual-serve runs for each browser page."""
    argv = [sys.executable, "-m", "appliance", "top", "--url", url]
    if not verify_tls:
        argv.append("--no-verify-tls")
    return shlex.join(argv)


def public_url(host: str, port: int) -> str:
    """The address browsers load the page's assets from: for a wildcard bind (0.0.0.0 or ::),
    which no browser can reach as written, this machine's host name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}"


def serve_in_browser(url: str, api_key: str | None, verify_tls: bool, host: str, port: int) -> None:
    """Serve the dashboard of the appliance at `url` on http://host:port until interrupted."""
    from textual_serve.server import Server

    if api_key:
        os.environ[API_KEY_ENV] = api_key
    server = Server(
        top_command(url, verify_tls),
        host=host,
        port=port,
        title="appliance top",
        public_url=public_url(host, port),
    )
    server.serve()
