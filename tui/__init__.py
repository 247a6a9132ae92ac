"""The terminal dashboard (Textual): live KV usage, queue depth, throughput, GPU readings and
per-request traces of an appliance, read only through its public stats API over HTTP."""

from __future__ import annotations

from tui.app import DashboardApp, create_app

__all__ = ["DashboardApp", "create_app"]
