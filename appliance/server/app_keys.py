"""Typed keys of the shared objects stored on the aiohttp Application."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from appliance.server.limits import Limiter
from appliance.server.metrics import Metrics
from appliance.server.registry import ModelRegistry
from appliance.server.request_log import RequestLog
from appliance.server.state import ServerState
from appliance.server.stats import StatsTracker

STATE = web.AppKey("state", ServerState)
TRACKER = web.AppKey("tracker", StatsTracker)
METRICS = web.AppKey("metrics", Metrics)
EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)
"""Worker threads for tokenization of long prompts (kept off the event loop)."""
REQUEST_LOG = web.AppKey("request_log", RequestLog)
LIMITER = web.AppKey("limiter", Limiter)
"""Per-key admission: concurrency, RPM, TPM and caps."""
REGISTRY = web.AppKey("registry", ModelRegistry)
"""The models and their engine cores, when several models serve (absent for one)."""
