"""The terminal dashboard (Textual): live KV usage, queue depth, throughput, GPU readings and
per-request traces of an appliance, read only through its public stats API over HTTP.

tui.sse, the Server-Sent Events parser, is shared with the load generator: the dashboard's
names below load (with Textual) only when first used, so importing tui.sse stays light.
"""

from __future__ import annotations

__all__ = ["DashboardApp", "create_app"]


def __getattr__(name: str):
    if name in __all__:
        from tui import app

        return getattr(app, name)
    raise AttributeError(f"module 'tui' has no attribute {name!r}")
