"""Client processes: one load stage spread over several processes, each with its own event loop
and HTTP session, so that the client is not what limits a run of hundreds of streams; the
parent splits each stage into even shares and merges the per-request results."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import multiprocessing
import os
import time
from collections.abc import Callable

import aiohttp

from appliance.loadgen import workload
from appliance.loadgen.client import ClientConfig, RequestResult
from appliance.loadgen.load_shapes import Stage, StageResult, run_stage
from appliance.loadgen.workload import WorkloadSpec

STREAMS_PER_PROCESS = 64
"""Streams one client process carries when the count is chosen for you. One process measured
7,858-8,348 out tok/s against 9,334 from two processes of 128 streams each (256 streams, random
Llama-3-8B shape on an H200)."""
START_DELAY_S = 0.2
"""Every process of a stage waits until the same instant before its first send."""


def auto_processes(max_streams: int, num_cpus: int | None = None) -> int:
    """Processes for `max_streams` concurrent streams: one per STREAMS_PER_PROCESS, at most half
    the machine's CPUs (the server under test may share them), at least one."""
    num_cpus = num_cpus or os.cpu_count() or 1
    return max(1, min(math.ceil(max_streams / STREAMS_PER_PROCESS), num_cpus // 2))


def shares(total: int, num_parts: int) -> list[int]:
    """`total` split into `num_parts` parts that differ by at most one, larger parts first."""
    return [total // num_parts + (i < total % num_parts) for i in range(num_parts)]


def split_stage(stage: Stage, num_processes: int) -> list[Stage]:
    """One stage per process: a closed loop's concurrency, an open loop's rate and either's
    request count divided evenly (a closed loop of c streams uses at most c processes)."""
    if stage.mode == "ramp":
        raise ValueError("a ramp runs in one client process: use --processes 1")
    if stage.mode == "closed":
        num = min(num_processes, int(stage.level))
        levels = [float(n) for n in shares(int(stage.level), num)]
    else:
        num = num_processes
        levels = [stage.level / num] * num
    counts = shares(stage.num_requests, num) if stage.num_requests is not None else [None] * num
    return [
        dataclasses.replace(stage, level=lv, num_requests=n)
        for lv, n in zip(levels, counts, strict=True)
        if n is None or n > 0
    ]


def merge(stage: Stage, parts: list[StageResult]) -> StageResult:
    """The processes' results as one stage: every request (its level the whole stage's), wall
    time from the first process's first send to the last process's last answer."""
    results = sorted((r for p in parts for r in p.results), key=lambda r: r.start)
    for r in results:
        r.level = stage.level
    start = min(p.start for p in parts)
    end = max(p.start + p.wall_s for p in parts)
    return StageResult(stage, results, start=start, wall_s=end - start)


class ClientProcesses:
    """`num` spawned client processes, each drawing every num-th request of the same seeded
    workload stream. Stage start times share the parent's clock: time.perf_counter is the
    system-wide monotonic clock on Linux and macOS."""

    def __init__(self, cfg: ClientConfig, spec: WorkloadSpec, num: int, t0: float) -> None:
        if num < 1:
            raise ValueError(f"client processes must be >= 1, got {num}")
        self.num, self.t0 = num, t0
        ctx = multiprocessing.get_context("spawn")  # no fork of a process running an event loop
        self._conns, self._procs = [], []
        for index in range(num):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_child_main,
                args=(child, cfg, spec, index, num, t0),
                name=f"appliance-bench-client-{index}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    async def start(self) -> None:
        """Wait until every process has its workload (RuntimeError when one cannot start; the
        caller still closes)."""
        replies = await asyncio.gather(*(asyncio.to_thread(_recv, c) for c in self._conns))
        if errors := [msg for kind, msg in replies if kind != "ready"]:
            raise RuntimeError(errors[0])

    async def run(
        self, stage: Stage, seed: int, on_done: Callable[[RequestResult], None] | None = None
    ) -> StageResult:
        """Run `stage` split over the processes; `on_done` sees every request as it finishes
        (a result without its latency lists and answer text)."""
        parts = split_stage(stage, self.num)
        start_at = time.perf_counter() + START_DELAY_S
        loop = asyncio.get_running_loop()
        for i, (conn, part) in enumerate(zip(self._conns, parts, strict=False)):
            conn.send((part, seed * 1000 + i, start_at))

        def pump(conn) -> StageResult | str:
            while True:
                kind, value = _recv(conn)
                if kind == "done":
                    if on_done is not None:
                        loop.call_soon_threadsafe(on_done, value)
                else:
                    return value

        replies = await asyncio.gather(
            *(asyncio.to_thread(pump, c) for c in self._conns[: len(parts)])
        )
        if errors := [r for r in replies if isinstance(r, str)]:
            raise RuntimeError(errors[0])
        return merge(stage, replies)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        for conn in self._conns:
            conn.close()


def _recv(conn) -> tuple[str, object]:
    try:
        return conn.recv()
    except EOFError:
        return "error", "a client process exited without a result"


def _child_main(conn, cfg: ClientConfig, spec: WorkloadSpec, index: int, num: int, t0: float):
    try:
        asyncio.run(_child(conn, cfg, spec, index, num, t0))
    except KeyboardInterrupt:
        pass
    finally:
        conn.close()


async def _child(conn, cfg: ClientConfig, spec: WorkloadSpec, index: int, num: int, t0: float):
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as http:
        try:
            pool = None if spec.jsonl else await workload.token_pool(http, cfg.url, cfg.headers())
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            conn.send(("error", f"cannot reach {cfg.url}: {exc}"))
            return
        work = itertools.islice(workload.items(spec, pool), index, None, num)
        conn.send(("ready", None))
        while (msg := await asyncio.to_thread(_recv_stage, conn)) is not None:
            stage, seed, start_at = msg
            await asyncio.sleep(max(0.0, start_at - time.perf_counter()))

            def on_done(result: RequestResult) -> None:
                conn.send(("done", dataclasses.replace(result, itl_s=[], answer=None)))

            result = await run_stage(http, cfg, work, stage, t0, on_done, seed=seed)
            conn.send(("result", result))


def _recv_stage(conn):
    try:
        return conn.recv()
    except EOFError:
        return None
