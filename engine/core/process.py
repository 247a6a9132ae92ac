"""Starting the engine core process: it builds the engine (load, plan, warm-up), binds the IPC
socket, reports EngineInfo, then runs CoreLoop until told to stop or its parent is gone.

Start-up talks over a multiprocessing pipe (each start-up phase as it begins, for the progress
display and /health; then the info, the plan included, or why it failed); serving talks over
ZMQ (engine.core.wire). Processes come from a forkserver that
has already imported the engine's modules, so a start costs a fork, not a fresh interpreter,
and no process is forked from one that has touched CUDA.

The core ignores SIGINT and SIGTERM: Ctrl-C in a terminal and a supervisor's stop reach the
whole process group, and the front end must drain its requests before the core stops. It
stops on the front end's SHUTDOWN, or by itself when the front end process is gone.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from engine.core.info import EngineInfo
from engine.core.loop import CoreLoop
from engine.sampling_params import SamplingParams
from engine.startup.phases import WEIGHTS_PHASE

logger = logging.getLogger("engine.core")
PRELOAD = ["engine.core.process", "engine.llm_engine"]
"""Modules the forkserver imports once, so each core process starts from them."""
WARMUP_LIMIT_S = 120
PHASE_START = "start"
PHASE_WARM_UP = "warm_up"
"""The phases a core reports around its engine's own (engine.startup.phases.PHASE_WORDS): "start"
before the engine reports any, "warm_up" for the core's warm-up request."""


def prestart() -> None:
    """Start the forkserver now, so that it imports the engine's modules (torch, Triton,
    transformers: seconds) while this process does other start-up work, such as planning."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    from multiprocessing import forkserver

    forkserver.ensure_running()


class CoreStartError(RuntimeError):
    """The engine failed to load in the core process (the message says why). `refused`: a
    ValueError before the weights began to load, a configuration that fails the same way on
    every start (a model that is not there, pins that cannot fit)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass
class CoreProcess:
    """The running core: its process, its socket address and what it reported."""

    process: Any
    address: str
    info: EngineInfo
    socket_dir: str

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def join(self, timeout: float) -> None:
        """Wait for the process to exit; kill it past `timeout`. Removes the socket dir."""
        self.process.join(timeout)
        if self.process.is_alive():
            logger.warning("the engine core did not stop within %gs: killing it", timeout)
            self.process.kill()
            self.process.join(5)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def start_core(
    source: Any,
    *,
    warmup: bool = False,
    on_phase: Callable[[str], None] | None = None,
    log_level: int | None = None,
    log_file: str | None = None,
    cancel: threading.Event | None = None,
) -> CoreProcess:
    """Start a core process on `source`, an engine (pickled across) or a picklable callable that
    builds one there (told each start-up phase when it takes an `on_phase` keyword, as
    LLMEngine does), and wait until it serves. Blocks for the whole load: call it from a
    worker thread, and set `cancel` to give up (the process is killed). `on_phase` gets each
    phase's name (engine.startup.phases.PHASE_WORDS) as it begins. Raises CoreStartError when the
    engine fails to load."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    socket_dir = tempfile.mkdtemp(prefix="appliance-core-")
    address = f"ipc://{socket_dir}/core"
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    if log_level is None:
        log_level = logging.getLogger().getEffectiveLevel()
    process = ctx.Process(
        target=_main,
        args=(source, address, child_conn, warmup, os.getpid(), log_level, log_file),
        name="engine-core",
        daemon=True,
    )
    process.start()
    child_conn.close()
    try:
        while True:
            if cancel is not None and cancel.is_set():
                raise CoreStartError("the engine's start was cancelled")
            if not parent_conn.poll(0.1):
                if not process.is_alive():
                    raise CoreStartError(_died(process.exitcode))
                continue
            try:
                kind, value = parent_conn.recv()
            except EOFError:
                process.join(5)
                raise CoreStartError(_died(process.exitcode)) from None
            if kind == "phase" and on_phase is not None:
                on_phase(value)
            elif kind in ("failed", "refused"):
                raise CoreStartError(value, refused=kind == "refused")
            elif kind == "ready":
                return CoreProcess(process, address, value, socket_dir)
    except BaseException:
        if process.is_alive():
            process.kill()
        process.join(5)
        shutil.rmtree(socket_dir, ignore_errors=True)
        raise
    finally:
        parent_conn.close()


def _died(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"the engine process was killed by {signal.Signals(-exitcode).name} while loading"
    return f"the engine process exited with status {exitcode} while loading"


def _main(source, address, conn, warmup, parent_pid, log_level, log_file) -> None:
    """The core process: build, report, serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    target = {"filename": log_file} if log_file else {}
    logging.basicConfig(
        level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", **target
    )
    phases: list[str] = []

    def report(name: str) -> None:
        phases.append(name)
        conn.send(("phase", name))

    try:
        report(PHASE_START)
        is_engine = hasattr(source, "step") and not isinstance(source, type)
        engine = source if is_engine else _build(source, report)
        if warmup:
            report(PHASE_WARM_UP)
            _warm_up(engine)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind(address)
        conn.send(("ready", EngineInfo.of(engine)))
    except BaseException as exc:
        if isinstance(exc, ValueError) and WEIGHTS_PHASE not in phases:
            conn.send(("refused", str(exc)))  # the message names what to change: no traceback
        else:
            logging.getLogger("engine.core").exception("the engine failed to load")
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    finally:
        conn.close()
    loop = CoreLoop(engine, sock, parent_pid)
    code = 0
    try:
        loop.run()
    except BaseException as exc:
        logger.exception("the engine core failed")
        loop.tell_dead(f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        sock.close(linger=2000)  # let the last frames reach the front ends
        ctx.term()
    # Exit now: a grammar compile still running on a pool thread must not keep the process
    # alive (the interpreter would wait for the thread at exit).
    logging.shutdown()
    os._exit(code)


def _build(loader: Callable[..., Any], on_phase: Callable[[str], None]) -> Any:
    """loader(), telling it each start-up phase where it takes `on_phase` (LLMEngine does)."""
    try:
        takes_phases = "on_phase" in inspect.signature(loader).parameters
    except (TypeError, ValueError):  # a callable without a signature to read
        takes_phases = False
    return loader(on_phase=on_phase) if takes_phases else loader()


def _warm_up(engine: Any) -> None:
    """One short greedy request through the loop the core will run, so nothing the first
    client meets is built for it (LLMEngine warms every shape already; this covers stand-ins
    and the path around the step)."""
    kind = getattr(getattr(engine, "kind", None), "kind", "generate")
    pooling = {"embed": "embed", "rerank": "score"}.get(kind)  # what the model serves
    params = SamplingParams(max_tokens=2, temperature=0.0, pooling=pooling)
    engine.add_request("__core-warmup", [1, 1, 1], params)
    deadline = time.monotonic() + WARMUP_LIMIT_S
    while engine.has_unfinished():
        if time.monotonic() > deadline:
            raise RuntimeError(f"a two-token warm-up request took over {WARMUP_LIMIT_S} s")
        engine.step()
