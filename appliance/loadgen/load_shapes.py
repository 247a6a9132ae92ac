"""Load shapes and the run loop: closed loop at a fixed concurrency, open loop with Poisson or
gamma arrivals, and a concurrency ramp, of single requests or of multi-turn conversations; plus
the /v1/stats sampler that runs alongside."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import aiohttp

from appliance.loadgen.client import ClientConfig, RequestResult, send
from appliance.loadgen.workload import Conversation, WorkItem

MODES = ("closed", "open", "ramp")


@dataclass
class Stage:
    """One load level held until `num_requests` are sent or `duration_s` has passed."""

    mode: str
    level: float
    """Concurrency (closed, ramp start) or requests per second (open)."""
    num_requests: int | None = None
    duration_s: float | None = None
    burstiness: float = 1.0
    """Open loop: gamma shape of the inter-arrival times; 1 is Poisson, < 1 burstier."""
    ramp_to: int | None = None
    """Ramp: the concurrency reached at the end of the stage (in equal steps)."""
    ramp_steps: int = 4

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("a stage needs a request count or a duration (or both)")
        if self.level <= 0 or self.burstiness <= 0:
            raise ValueError("level and burstiness must be > 0")
        if self.mode == "ramp" and (self.duration_s is None or not self.ramp_to):
            raise ValueError("a ramp needs a duration and a target concurrency")

    def concurrency_at(self, elapsed: float) -> int:
        """The concurrency a closed loop or ramp should hold `elapsed` seconds in."""
        if self.mode != "ramp":
            return int(self.level)
        steps = max(1, self.ramp_steps)
        step = min(steps - 1, int(elapsed / (self.duration_s / steps)))
        start, end = int(self.level), int(self.ramp_to)
        return round(start + (end - start) * step / max(1, steps - 1))


@dataclass
class StatsSample:
    """One reading of /v1/stats (None fields: the server did not say)."""

    t: float
    num_running: int | None = None
    num_waiting: int | None = None
    kv_usage_perc: float | None = None
    gpu_memory_used_bytes: int | None = None


@dataclass
class StageResult:
    stage: Stage
    results: list[RequestResult] = field(default_factory=list)
    start: float = 0.0
    """Seconds from the run's start."""
    wall_s: float = 0.0
    """From the first send to the last answer."""
    server_output_tokens: int | None = None
    """The server's own generated-token count over the stage (its counter after minus before;
    None when the server does not report one)."""
    server_cache_queries: int | None = None
    """Prompt tokens the server looked up in its prefix cache over the stage (its counter after
    minus before; None when the server does not report one)."""
    server_cached_tokens: int | None = None
    """Of those, the ones it found cached (the same way)."""


def arrival_gaps(rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Inter-arrival times with mean 1/rate: gamma(shape=burstiness); exponential at 1."""
    scale = 1.0 / (rate * burstiness)
    while True:
        yield rng.gammavariate(burstiness, scale)


async def run_stage(
    session: aiohttp.ClientSession,
    cfg: ClientConfig,
    work: Iterator[WorkItem | Conversation],
    stage: Stage,
    t0: float,
    on_done: Callable[[RequestResult], None] | None = None,
    seed: int = 0,
) -> StageResult:
    """Drive one stage; every request's outcome is collected, none raises. A conversation
    counts as one unit of the load (the concurrency is conversations in flight, the request
    count and rate count conversations) and sends its turns one after another, each once the
    previous answer is in; one started before the stage's time is up runs to its end."""
    out = StageResult(stage, start=time.perf_counter() - t0)
    begin = time.perf_counter()
    sent = 0

    def may_send() -> bool:
        if stage.num_requests is not None and sent >= stage.num_requests:
            return False
        return stage.duration_s is None or time.perf_counter() - begin < stage.duration_s

    async def request(item: WorkItem, level: float) -> RequestResult:
        result = await send(session, cfg, item, level, t0)
        out.results.append(result)
        if on_done is not None:
            on_done(result)
        return result

    async def one(unit: WorkItem | Conversation, level: float) -> None:
        if isinstance(unit, WorkItem):
            await request(unit, level)
            return
        while (item := unit.next_item()) is not None:
            result = await request(item, level)
            if not result.ok:  # no answer to carry on with: the conversation ends here
                return
            unit.add_answer(result.answer or "")

    if stage.mode == "open":
        tasks = []
        gaps = arrival_gaps(stage.level, stage.burstiness, random.Random(seed))
        next_at = begin
        while may_send():
            tasks.append(asyncio.create_task(one(next(work), stage.level)))
            sent += 1
            next_at += next(gaps)
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.gather(*tasks)
    else:

        async def worker(index: int) -> None:
            nonlocal sent
            while may_send():
                level = stage.concurrency_at(time.perf_counter() - begin)
                if index >= level:  # a ramp worker waiting for its turn
                    await asyncio.sleep(0.05)
                    continue
                sent += 1
                await one(next(work), level)

        top = max(int(stage.level), int(stage.ramp_to or 0))
        await asyncio.gather(*(worker(i) for i in range(top)))
    out.wall_s = time.perf_counter() - begin
    return out


class StatsSampler:
    """Polls /v1/stats every `interval_s` while running; failed readings are skipped."""

    def __init__(
        self, session: aiohttp.ClientSession, cfg: ClientConfig, t0: float, interval_s: float = 0.5
    ) -> None:
        self.session, self.cfg, self.t0, self.interval_s = session, cfg, t0, interval_s
        self.samples: list[StatsSample] = []
        self.num_failed = 0
        self._task: asyncio.Task | None = None

    async def read(self) -> dict | None:
        """One /v1/stats document, or None."""
        try:
            async with asyncio.timeout(5.0):
                url = f"{self.cfg.url}/v1/stats"
                async with self.session.get(url, headers=self.cfg.headers()) as resp:
                    return await resp.json() if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None

    async def _loop(self) -> None:
        while True:
            doc = await self.read()
            if doc is None:
                self.num_failed += 1
            else:
                self.samples.append(to_sample(doc, time.perf_counter() - self.t0))
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def to_sample(doc: dict, t: float) -> StatsSample:
    queue, engine, gpu = doc.get("queue") or {}, doc.get("engine") or {}, doc.get("gpu") or {}
    return StatsSample(
        t=t,
        num_running=queue.get("num_running"),
        num_waiting=queue.get("num_waiting"),
        kv_usage_perc=engine.get("kv_usage_perc"),
        gpu_memory_used_bytes=gpu.get("memory_used_bytes"),
    )
