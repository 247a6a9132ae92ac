"""run_server: `appliance serve` as a process: refuse unsafe binds, listen at once, load the
engine in its core process with progress (/health says which phase meanwhile), print the URL,
serve, and on SIGTERM/SIGINT drain in-flight requests and exit 0. An engine that fails to load
ends it with 1, or 2 for a configuration it refused (the reason on stderr both times).
With --tui the dashboard owns the terminal instead (serve_tui); logs go to a file and a panel."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress as RichBar
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from appliance.api_workers import start_workers, stop_workers, watch_workers
from appliance.listener import (
    ENGINE_GONE_GRACE_S,
    LOG_FORMAT,
    base_url,
    listen,
    make_ssl_context,
)
from appliance.server.app import Progress, create_app
from appliance.server.app_keys import STATE
from appliance.server.state import Phase
from appliance.settings import ServeSettings

logger = logging.getLogger("appliance.server")


class ConsoleProgress(Progress):
    """Startup phases as rich spinners with elapsed time, on stderr."""

    def __init__(self, console: Console) -> None:
        self.bar = RichBar(
            SpinnerColumn(finished_text="[green]done"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task = None

    def phase(self, name: str) -> None:
        if self.task is None:
            self.bar.start()
        else:
            self.bar.update(self.task, total=1, completed=1)
        self.task = self.bar.add_task(name, total=None)

    def done(self) -> None:
        if self.task is not None:
            self.bar.update(self.task, total=1, completed=1)
        self.bar.stop()


def run_server(settings: ServeSettings, loader: Callable[..., Any] | None = None) -> int:
    """Run until a signal; the exit status is 0 after a drain, 1 on a startup failure and 2
    for a refused configuration. `loader` builds the engine in its core process (default:
    LLMEngine for the settings, which plans every setting they leave open:
    appliance.serve_plan)."""
    refusal = settings.bind_refusal()
    if refusal:
        print(f"appliance serve: {refusal}", file=sys.stderr)
        return 2
    if settings.tui and not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            "appliance serve: --tui needs a terminal (stdin and stdout are not a TTY)",
            file=sys.stderr,
        )
        return 2
    log_target: dict = {"stream": sys.stderr}
    if settings.tui:
        log_path = settings.tui_log_path
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(
                f"appliance serve: cannot create {log_path.parent}: {exc.strerror}", file=sys.stderr
            )
            return 2
        log_target = {"filename": str(log_path)}
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT, **log_target)
    try:  # read the model's generation defaults now: a broken file is a refused configuration
        logger.debug("generation defaults from %s", settings.generation_defaults.origin)
    except ValueError as exc:
        print(f"appliance serve: {exc}", file=sys.stderr)
        return 2
    try:
        ssl_ctx = make_ssl_context(settings)
    except (OSError, ssl.SSLError) as exc:
        print(f"appliance serve: cannot load the TLS certificate/key: {exc}", file=sys.stderr)
        return 2
    if loader is None:
        from appliance.serve_plan import EngineLoader
        from appliance.triton_cache import triton_cache_env
        from engine.core.process import prestart

        logger.info("Triton kernel cache: %s", triton_cache_env())
        prestart()  # the engine's process imports its modules while this one starts listening
        if not settings.model_specs:  # several models: each gets its own loader
            loader = EngineLoader(settings)
    if settings.tui:
        code = asyncio.run(serve_tui(settings, ssl_ctx, loader))
        print(f"appliance: stopped; the server log is {settings.tui_log_path}", file=sys.stderr)
        return code
    return asyncio.run(serve(settings, ssl_ctx, loader))


async def serve(
    settings: ServeSettings,
    ssl_ctx: ssl.SSLContext | None = None,
    loader: Callable[[], Any] | None = None,
) -> int:
    """The server's life on the running loop (the main thread's, so that signals reach it)."""
    console = Console(stderr=True)
    app = create_app(settings, loader=loader, progress=ConsoleProgress(console))
    runner = await listen(app, settings, ssl_ctx)
    if runner is None:
        return 1
    url = base_url(runner, settings, ssl_ctx is not None)
    console.print(
        f"appliance: listening on {url}; the model loads meanwhile (GET /health says what it "
        "is doing; other routes answer 503 until it is ready)",
        highlight=False,
        soft_wrap=True,
    )
    signals = _Signals(settings.drain_timeout)
    workers: list = []
    worker_gone = asyncio.Event()
    watcher = None
    try:
        state = app[STATE]
        while state.phase is Phase.LOADING and not signals.stop.is_set():
            await asyncio.sleep(0.05)
        if state.phase is Phase.FAILED:
            await asyncio.sleep(ENGINE_GONE_GRACE_S)  # /health says why meanwhile
            return _load_failed(state, console)
        if not signals.stop.is_set():
            print(
                f"appliance: serving {state.model_name} at {url}/v1 "
                "(health: /health, stats: /v1/stats; Ctrl-C drains and stops)",
                flush=True,
            )
            port = runner.addresses[0][1] if runner.addresses else settings.port
            if settings.api_workers > 1:
                workers = start_workers(settings, port, state.engine, state.core.address)
                watcher = asyncio.create_task(watch_workers(workers, worker_gone))
                logger.info("%d API workers share port %d", settings.api_workers, port)
            await _first(signals.stop, state.core_gone, worker_gone)
        if state.core_gone.is_set():
            return await _engine_gone(state)
        if watcher is not None:
            watcher.cancel()  # the workers stop now on purpose
        stopping = asyncio.create_task(stop_workers(workers, settings.drain_timeout + 10))
        drained = await state.drain(settings.drain_timeout, signals.force)
        logger.info("drain %s; stopping", _drain_outcome(drained, signals.force))
        await stopping
        return 1 if worker_gone.is_set() else 0
    finally:
        signals.close()
        if workers:
            await stop_workers(workers, 5)
        await runner.cleanup()


def _drain_outcome(drained: bool, force: asyncio.Event | None = None) -> str:
    if drained:
        return "complete"
    if force is not None and force.is_set():
        return "cut by a second signal"
    return "timed out: cut the rest"


def _load_failed(state, console: Console | None = None) -> int:
    """The engine did not start: print why, and return 2 for a configuration the engine refused
    (a restart fails the same way), else 1 (a supervisor may restart it)."""
    if state.load_refused:
        print(f"appliance serve: {state.load_error}", file=sys.stderr, flush=True)
        return 2
    (console or Console(stderr=True)).print(
        f"[red]appliance serve: the engine failed to start: {escape(state.load_error or '')}",
        soft_wrap=True,
    )
    return 1


async def _first(*events: asyncio.Event) -> None:
    """Wait until any of `events` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def _engine_gone(state) -> int:
    """The engine core died while serving: every open stream has had its error event and
    every new request gets a 503; leave a moment for those answers to go out, then exit 1 so
    that a supervisor (systemd, docker) restarts the server."""
    logger.error(
        "the engine core stopped (%s): exiting so that it can be restarted", state.load_error
    )
    await asyncio.sleep(ENGINE_GONE_GRACE_S)
    return 1


class LogProgress(Progress):
    """Startup phases as log lines (with --tui, where the dashboard owns the terminal)."""

    def phase(self, name: str) -> None:
        logger.info("startup: %s", name)

    def done(self) -> None:
        logger.info("startup: done")


class PanelLogHandler(logging.Handler):
    """Forwards log records, from any thread, to the dashboard's log panel on its loop; keeps
    them until `attach` names the panel (the server logs before the dashboard exists)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.write: Callable[[str], None] | None = None
        self.pending: list[str] = []
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def attach(self, write: Callable[[str], None]) -> None:
        self.write = write
        for line in self.pending:
            write(line)
        self.pending.clear()

    def detach(self) -> None:
        """The dashboard has closed: drop lines from now on (the file still gets them)."""
        self.write = lambda line: None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.loop.call_soon_threadsafe(self._deliver, self.format(record))
        except RuntimeError:  # the loop has closed: the file still has the line
            pass

    def _deliver(self, line: str) -> None:
        if self.write is None:
            self.pending.append(line)
        else:
            self.write(line)


async def serve_tui(
    settings: ServeSettings,
    ssl_ctx: ssl.SSLContext | None = None,
    loader: Callable[[], Any] | None = None,
) -> int:
    """The server and the dashboard on one loop: the dashboard reads this server's public
    stats API over loopback like `appliance top` would; quitting it drains and stops."""
    from tui import create_app as create_dashboard

    loop = asyncio.get_running_loop()
    handler = PanelLogHandler(loop)
    logging.getLogger().addHandler(handler)
    try:
        return await _serve_with_dashboard(settings, ssl_ctx, loader, handler, create_dashboard)
    finally:
        logging.getLogger().removeHandler(handler)


async def _serve_with_dashboard(
    settings: ServeSettings,
    ssl_ctx: ssl.SSLContext | None,
    loader: Callable[[], Any] | None,
    handler: PanelLogHandler,
    create_dashboard: Callable[..., Any],
) -> int:
    loop = asyncio.get_running_loop()
    app = create_app(settings, loader=loader, progress=LogProgress())
    runner = await listen(app, settings, ssl_ctx)
    if runner is None:
        return 1
    port = runner.addresses[0][1] if runner.addresses else settings.port
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    url = f"{'https' if ssl_ctx else 'http'}://{host}:{port}"
    key = settings.api_keys[0].key if settings.api_keys else None
    dashboard = create_dashboard(url, key, verify_tls=False, log_path=str(settings.tui_log_path))
    handler.attach(dashboard.write_log)
    loop.add_signal_handler(signal.SIGTERM, dashboard.exit)
    logger.info("serving at %s/v1 (health: /health, stats: /v1/stats)", url)
    state = app[STATE]

    async def close_when_engine_gone() -> None:
        await _first(state.core_gone, state.load_failed)
        if state.core_gone.is_set():
            await _engine_gone(state)
        dashboard.exit()

    watch = asyncio.create_task(close_when_engine_gone())
    try:
        await dashboard.run_async()
    finally:
        watch.cancel()
        loop.remove_signal_handler(signal.SIGTERM)
        handler.detach()
        if state.inflight:
            print(
                f"appliance: draining {len(state.inflight)} requests (up to "
                f"{settings.drain_timeout:g}s)…",
                file=sys.stderr,
            )
        if not state.load_failed.is_set():
            drained = await state.drain(settings.drain_timeout)
            logger.info("drain %s; stopping", _drain_outcome(drained))
        await runner.cleanup()
    if state.load_failed.is_set():
        return _load_failed(state)
    return 1 if state.core_gone.is_set() else 0


class _Signals:
    """SIGTERM/SIGINT: the first starts the drain, a second one cuts it short."""

    def __init__(self, drain_timeout: float) -> None:
        self.stop, self.force = asyncio.Event(), asyncio.Event()
        self.drain_timeout = drain_timeout
        self.loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.stop.is_set():
            logger.warning("second %s: cutting in-flight requests now", name)
            self.force.set()
        else:
            logger.info("%s: draining (up to %gs)", name, self.drain_timeout)
            self.stop.set()

    def close(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.remove_signal_handler(signum)
