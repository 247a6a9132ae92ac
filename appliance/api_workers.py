"""`appliance serve --api-workers N`: N - 1 more HTTP front ends, each its own process with its
own event loop, listening on the same port (SO_REUSEPORT: the kernel spreads connections over
them) and talking to the one engine core the main front end started.

The main process supervises: it starts the workers once its engine serves, forwards SIGTERM to
them when it drains, and stops with status 1 when a worker dies (a supervisor restarts the
whole server). A worker drains on SIGTERM like the main front end, ignores SIGINT (Ctrl-C
reaches the whole process group; the main process forwards it as SIGTERM), and exits 1 when
the engine core is gone. Each worker keeps its own request records, so /v1/stats and
/v1/requests/{id} show the requests of the worker that answers; the engine's figures are the
same on every worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import signal
import sys
from typing import Any

from appliance.listener import ENGINE_GONE_GRACE_S, LOG_FORMAT, listen, make_ssl_context
from appliance.settings import ServeSettings

logger = logging.getLogger("appliance.server")


def start_workers(settings: ServeSettings, port: int, info: Any, address: str) -> list:
    """Start workers 1..N-1 on `port` (the one the main front end bound) for the core at
    `address`; returns their processes."""
    ctx = multiprocessing.get_context("forkserver")
    worker_settings = dataclasses.replace(settings, port=port)
    workers = []
    for index in range(1, settings.api_workers):
        process = ctx.Process(
            target=_worker_main,
            args=(worker_settings, info, address),
            name=f"api-worker-{index}",
            daemon=True,
        )
        process.start()
        workers.append(process)
    return workers


async def stop_workers(workers: list, timeout: float) -> list[int | None]:
    """SIGTERM every worker (each drains), wait up to `timeout` s, kill the rest; returns their
    exit codes."""
    for process in workers:
        if process.is_alive():
            process.terminate()
    loop = asyncio.get_running_loop()
    for process in workers:
        await loop.run_in_executor(None, process.join, timeout)
        if process.is_alive():
            process.kill()
            await loop.run_in_executor(None, process.join, 5)
    return [process.exitcode for process in workers]


async def watch_workers(workers: list, gone: asyncio.Event) -> None:
    """Set `gone` when a worker exits by itself."""
    while not gone.is_set():
        dead = [p for p in workers if not p.is_alive()]
        if dead:
            logger.error("API worker %s stopped (exit %s)", dead[0].name, dead[0].exitcode)
            gone.set()
            return
        await asyncio.sleep(0.2)


def _worker_main(settings: ServeSettings, info: Any, address: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    sys.exit(asyncio.run(_serve_worker(settings, info, address)))


async def _serve_worker(settings: ServeSettings, info: Any, address: str) -> int:
    from appliance.server.app import create_app
    from appliance.server.app_keys import STATE

    app = create_app(settings, core=(info, address))
    runner = await listen(app, settings, make_ssl_context(settings))  # reuse_port: N > 1
    if runner is None:
        return 1
    state = app[STATE]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        waits = [asyncio.ensure_future(e.wait()) for e in (stop, state.core_gone)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if state.core_gone.is_set():
            await asyncio.sleep(ENGINE_GONE_GRACE_S)
            return 1
        await state.drain(settings.drain_timeout)
        return 0
    finally:
        await runner.cleanup()
