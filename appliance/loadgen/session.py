"""LoadSession: one HTTP session to one appliance, its calibrated workload, the /v1/stats
sampler and a progress bar; runs stages one after another, in this process or spread over
client processes, and reads the server's generated-token and prefix-cache counters around each
(shared by bench and tune)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from appliance.loadgen import workload
from appliance.loadgen.client import ClientConfig, RequestResult
from appliance.loadgen.load_shapes import Stage, StageResult, StatsSampler, run_stage
from appliance.loadgen.processes import ClientProcesses
from appliance.loadgen.workload import WorkloadSpec

SERVER_COUNTERS = (
    "generation_tokens_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
)
"""The engine counters of /v1/stats read before and after each stage."""


@dataclass
class ServerInfo:
    """What /v1/stats says about the server under test (None: not reported)."""

    model: str | None = None
    device: str | None = None
    gpu_name: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    config: dict | None = None
    prefix_caching: bool | None = None
    """Whether the engine keeps a prefix cache."""

    @classmethod
    def from_stats(cls, doc: dict | None) -> ServerInfo:
        if not doc:
            return cls()
        config = doc.get("config") or {}
        return cls(
            model=doc.get("model"),
            device=doc.get("device"),
            gpu_name=(doc.get("gpu") or {}).get("name"),
            dtype=config.get("dtype"),
            quantization=config.get("quantization"),
            config=config or None,
            prefix_caching=(doc.get("engine") or {}).get("prefix_caching"),
        )


class LoadSession:
    """`async with LoadSession(cfg, spec) as s: await s.run(stage)`; traffic goes only to
    cfg.url."""

    def __init__(
        self,
        cfg: ClientConfig,
        spec: WorkloadSpec,
        console: Console | None = None,
        show_progress: bool = True,
        sample_interval_s: float = 0.5,
        num_processes: int = 1,
    ) -> None:
        self.cfg, self.spec = cfg, spec
        self.console = console or Console(stderr=True)
        self.show_progress = show_progress
        self.sample_interval_s = sample_interval_s
        self.t0 = time.perf_counter()
        self.stages: list[StageResult] = []
        self.info = ServerInfo()
        self._session: aiohttp.ClientSession | None = None
        self.sampler: StatsSampler | None = None
        self.num_processes = num_processes
        """1: requests go from this process; more: from that many client processes."""
        self._clients: ClientProcesses | None = None

    async def __aenter__(self) -> LoadSession:
        # No connection cap: the load shape, not the HTTP pool, sets the concurrency.
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        try:
            cfg = self.cfg
            pool = None
            if not self.spec.jsonl:
                pool = await workload.token_pool(self._session, cfg.url, cfg.headers())
        except (aiohttp.ClientError, TimeoutError) as exc:
            await self._session.close()
            raise RuntimeError(f"cannot reach {self.cfg.url}: {exc}") from None
        except RuntimeError:
            await self._session.close()
            raise
        self.work = workload.items(self.spec, pool)
        self.sampler = StatsSampler(self._session, self.cfg, self.t0, self.sample_interval_s)
        self.info = ServerInfo.from_stats(await self.sampler.read())
        self.sampler.start()
        if self.num_processes > 1:
            self._clients = ClientProcesses(self.cfg, self.spec, self.num_processes, self.t0)
            try:
                await self._clients.start()
            except RuntimeError:
                await self.__aexit__()
                raise
        return self

    async def __aexit__(self, *exc) -> None:
        if self._clients is not None:
            await asyncio.to_thread(self._clients.close)
            self._clients = None
        if self.sampler is not None:
            await self.sampler.stop()
        if self._session is not None:
            await self._session.close()

    @property
    def samples(self):
        return self.sampler.samples if self.sampler else []

    async def stats(self) -> dict | None:
        return await self.sampler.read() if self.sampler else None

    async def _server_counters(self) -> dict[str, int]:
        """The server's SERVER_COUNTERS, read on a connection of their own: the load's
        connection pool stays as the last stage left it (which of its streams reuse a warm
        connection shapes the first tokens' timing)."""
        async with aiohttp.ClientSession(trust_env=False) as http:
            sampler = StatsSampler(http, self.cfg, self.t0)
            return engine_counters(await sampler.read())

    def results(self) -> list[RequestResult]:
        return [r for st in self.stages for r in st.results]

    async def run(self, stage: Stage, label: str | None = None) -> StageResult:
        label = label or f"{stage.mode} {stage.level:g}"
        if stage.duration_s is not None:
            label += f" (up to {stage.duration_s:g}s)"
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[errors]} errors"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.show_progress,
            transient=True,
        ) as progress:
            turns = self.spec.multi_turn or 1  # a stage counts conversations
            total = None if stage.num_requests is None else stage.num_requests * turns
            task = progress.add_task(label, total=total, errors=0)
            num_errors = 0

            def on_done(result: RequestResult) -> None:
                nonlocal num_errors
                num_errors += not result.ok
                progress.update(task, advance=1, errors=num_errors)

            assert self._session is not None, "use LoadSession as an async context manager"
            before = await self._server_counters()
            seed = self.spec.seed + len(self.stages)
            if self._clients is not None:
                result = await self._clients.run(stage, seed, on_done)
            else:
                result = await run_stage(
                    self._session, self.cfg, self.work, stage, self.t0, on_done, seed=seed
                )
            after = await self._server_counters()
        rose = {k: after[k] - before[k] for k in after.keys() & before.keys()}
        result.server_output_tokens = rose.get("generation_tokens_total")
        result.server_cache_queries = rose.get("prefix_cache_queries_total")
        result.server_cached_tokens = rose.get("prefix_cache_hits_total")
        self.stages.append(result)
        return result


def engine_counters(doc: dict | None) -> dict[str, int]:
    """The SERVER_COUNTERS a /v1/stats document reports (those it leaves out are missing)."""
    engine = (doc or {}).get("engine") or {}
    return {k: int(v) for k in SERVER_COUNTERS if isinstance(v := engine.get(k), int | float)}
