"""create_app: the aiohttp Application: middlewares, routes, shared state and long-lived tasks.

The engine runs in its own process, the engine core (engine.core): a cleanup-context task
starts it from an engine handed in (tests hand in a fake, pickled across) or from a loader that
builds one there, so the HTTP server answers `/health` (503 "loading") while it loads. This
process keeps the HTTP work: parsing, tokenization, chat templates, SSE, stats and metrics.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from aiohttp import web

from appliance.key_limits import ANONYMOUS
from appliance.serve_plan import log_plan
from appliance.server.admin_routes import routes as admin_routes
from appliance.server.anthropic_api import routes as anthropic_routes
from appliance.server.app_keys import (
    EXECUTOR,
    LIMITER,
    METRICS,
    REGISTRY,
    REQUEST_LOG,
    STATE,
    TRACKER,
)
from appliance.server.auth import make_auth_middleware
from appliance.server.embedding_routes import routes as embedding_routes
from appliance.server.errors import error_middleware
from appliance.server.key_stats import KeyCollector
from appliance.server.limits import Limiter
from appliance.server.metrics import Metrics
from appliance.server.model_route import RegistryFront
from appliance.server.model_routes import routes as model_routes
from appliance.server.openai_routes import routes as openai_routes
from appliance.server.registry import ModelRegistry
from appliance.server.request_keys import (
    CLIENT_GONE,
    KEY_NAME,
    RATE_LIMIT_HEADERS,
    RECEIVED_AT,
    REQUEST_ID,
)
from appliance.server.request_log import RequestLog
from appliance.server.responses_api import setup as setup_responses
from appliance.server.state import ServerState
from appliance.server.stats import StatsTracker
from appliance.server.web_routes import setup_web
from appliance.settings import ServeSettings
from engine.core.process import PHASE_WARM_UP, CoreStartError, start_core
from engine.startup.phases import phase_words

logger = logging.getLogger("appliance.server")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:~-]{1,128}$")
SAMPLE_INTERVAL_S = 0.25
EXPOSED_HEADERS = ", ".join(
    ["X-Request-Id", "Retry-After"]
    + [
        f"x-ratelimit-{w}-{u}"
        for u in ("requests", "tokens")
        for w in ("limit", "remaining", "reset")
    ]
)
"""Response headers a browser client may read (CORS)."""


class Progress:
    """Startup progress callbacks (the CLI shows them with rich; tests ignore them)."""

    def phase(self, name: str) -> None:
        """The engine has begun `name`, in a user's words ("loading weights")."""

    def done(self) -> None: ...


CLIENT_CLOSED = 499
"""The access log's status for a request whose client disconnected before its answer ended
(nginx's "client closed request")."""


@web.middleware
async def request_id_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Give every request an id (an incoming X-Request-Id if it is sane) and log its outcome:
    one access-log line per request, a client that went away included (499)."""
    incoming = request.headers.get("X-Request-Id", "")
    request[REQUEST_ID] = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
    request[RECEIVED_AT] = time.time()
    try:
        response = await handler(request)
    except (asyncio.CancelledError, ConnectionResetError):  # the client went away
        _access_log(request, CLIENT_CLOSED)
        raise
    _access_log(request, CLIENT_CLOSED if request.get(CLIENT_GONE) else response.status)
    return response


def _access_log(request: web.Request, status: int) -> None:
    logger.info(
        "%s %s %s %d %.1fms key=%s%s",
        request[REQUEST_ID],
        request.method,
        request.path,
        status,
        (time.time() - request[RECEIVED_AT]) * 1000,
        request.get(KEY_NAME, "-"),
        " client disconnected" if status == CLIENT_CLOSED else "",
    )


async def _on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    if REQUEST_ID in request:
        response.headers["X-Request-Id"] = request[REQUEST_ID]
    response.headers.update(request.get(RATE_LIMIT_HEADERS, {}))
    origins = request.app[STATE].settings.cors_origin
    origin = request.headers.get("Origin")
    if origins and origin and ("*" in origins or origin in origins):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"
        response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS


@web.middleware
async def cors_preflight_middleware(request: web.Request, handler) -> web.StreamResponse:
    origins = request.app[STATE].settings.cors_origin
    if (
        request.method == "OPTIONS"
        and origins
        and "Access-Control-Request-Method" in request.headers
    ):
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": (
                    "Authorization, Content-Type, X-Request-Id, X-Api-Key, anthropic-version, "
                    "anthropic-beta"
                ),
                "Access-Control-Max-Age": "600",
            },
        )
    return await handler(request)


def create_app(
    config: ServeSettings,
    engine: Any = None,
    *,
    loader: Callable[[], Any] | None = None,
    progress: Progress | None = None,
    core: tuple[Any, str] | None = None,
) -> web.Application:
    """Build the app. `engine`: an LLMEngine-like object to run in the core process (pickled
    across); otherwise `loader` (by default LLMEngine from the settings), a picklable callable
    that the core process calls to build it. `core`: (EngineInfo, address) of a core another
    front end started (an API worker): connect to it instead of starting one."""
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[
            request_id_middleware,
            error_middleware,
            cors_preflight_middleware,
            make_auth_middleware(config.api_keys),
        ],
    )
    registry = None
    if config.model_specs:
        registry = ModelRegistry(config, _start_model, _registry_loader(loader))
        state: ServerState = RegistryFront(config, registry)
        app[REGISTRY] = registry
    else:
        state = ServerState(config, defaults=config.generation_defaults)
    logger.info("%s", state.defaults.describe())
    app[STATE] = state
    app[TRACKER] = StatsTracker()
    app[METRICS] = Metrics(state)
    app[TRACKER].on_finish.append(app[METRICS].request_closed)
    limits = {k.name: k.limits for k in config.api_keys} or {ANONYMOUS: config.anonymous_limits}
    app[LIMITER] = Limiter(limits)
    for name, key_limits in limits.items():
        app[TRACKER].keys.declare(name, key_limits.priority)
    app[TRACKER].on_finish.append(app[TRACKER].keys.closed)
    app[METRICS].registry.register(KeyCollector(app[TRACKER].keys, lambda: state.model_name))
    app[EXECUTOR] = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")
    app.router.add_routes(openai_routes)
    app.router.add_routes(embedding_routes)
    app.router.add_routes(admin_routes)
    app.router.add_routes(model_routes)
    setup_responses(app)
    app.router.add_routes(anthropic_routes)
    if config.web:
        setup_web(app)
    app.on_response_prepare.append(_on_prepare)
    app.cleanup_ctx.append(_request_log_ctx)
    if registry is not None:
        app.cleanup_ctx.append(_registry_ctx)
    elif core is not None:
        app.cleanup_ctx.append(_connect_ctx(*core))
    else:
        app.cleanup_ctx.append(_engine_ctx(engine, loader or _default_loader(config), progress))
    app.cleanup_ctx.append(_sampler_ctx)
    return app


def _default_loader(config: ServeSettings) -> Callable[[], Any]:
    from appliance.serve_plan import EngineLoader

    return EngineLoader(config)


async def _request_log_ctx(app: web.Application):
    path = app[STATE].settings.log_requests
    if path:
        log = RequestLog(path)
        app[REQUEST_LOG] = log
        app[TRACKER].on_finish.append(log.write)
    yield
    if path:
        app[REQUEST_LOG].close()
    app[EXECUTOR].shutdown(wait=False, cancel_futures=True)


def _engine_ctx(engine: Any, loader: Callable[[], Any], progress: Progress | None):
    async def ctx(app: web.Application):
        state = app[STATE]
        source = engine if engine is not None else loader
        task = asyncio.create_task(_load(state, source, progress or Progress()))
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await state.close()

    return ctx


def _registry_loader(loader: Callable | None) -> Callable[[ServeSettings], Any]:
    """A registry model's loader from its settings (a test may hand in its own factory)."""
    if loader is not None:
        return loader
    from appliance.serve_plan import EngineLoader

    return EngineLoader


async def _start_model(state: ServerState, loader: Any) -> None:
    await _load(state, loader, Progress())


async def _registry_ctx(app: web.Application):
    """Several models: load the pinned ones (else the first), then serve; unload the idle."""
    state, registry = app[STATE], app[REGISTRY]

    async def start() -> None:
        await registry.start()
        state.ready()

    tasks = [asyncio.create_task(start()), asyncio.create_task(registry.sweep())]
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await state.close()


def _connect_ctx(info: Any, address: str):
    async def ctx(app: web.Application):
        state = app[STATE]
        await state.attach(info, address)
        state.ready()
        yield
        await state.close()

    return ctx


async def _load(state: ServerState, source: Any, progress: Progress) -> None:
    loop = asyncio.get_running_loop()
    settings = state.settings

    def on_phase(name: str) -> None:
        loop.call_soon_threadsafe(_on_phase, name)

    shown: list[str] = []

    def _on_phase(name: str) -> None:
        state.loading = name
        words = phase_words(name)
        if not shown or shown[-1] != words:  # the engine's warm-up phases read as one
            shown.append(words)
            progress.phase(words)

    cancel = threading.Event()
    start = partial(
        start_core,
        source,
        warmup=settings.warmup,
        on_phase=on_phase,
        log_file=str(settings.tui_log_path) if settings.tui else None,
        cancel=cancel,
    )
    try:
        try:
            core = await loop.run_in_executor(None, start)
        except asyncio.CancelledError:
            cancel.set()  # the thread kills the loading process and returns
            raise
        await state.attach(core.info, core.address, core)
        log_plan(core.info.plan)  # the plan that runs: the core made it
        if settings.warmup:
            _on_phase(PHASE_WARM_UP)
            try:  # the first render compiles the template: do it now, not on a client's request
                core.info.apply_chat_template([{"role": "user", "content": "Hello"}])
            except ValueError:
                pass
        state.ready()
        progress.done()
    except asyncio.CancelledError:
        raise
    except CoreStartError as exc:
        if not exc.refused:  # a refusal is the user's to read once, where serve prints it
            logger.error("the engine failed to load: %s", exc)
        state.fail_load(str(exc), refused=exc.refused)
        progress.done()
    except BaseException as exc:
        logger.exception("the engine failed to load")
        state.fail_load(f"{type(exc).__name__}: {exc}")
        progress.done()


async def _sampler_ctx(app: web.Application):
    async def sample() -> None:
        while True:
            for state in app[STATE].serving_states():  # each loaded model's engine
                if state.core is not None:
                    app[TRACKER].sample_engine(state.core.stats(), model=state.model_name)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    task = asyncio.create_task(sample())
    yield
    task.cancel()
