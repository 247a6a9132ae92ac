"""The LLMEngine's counters and gauges as one dict (what /v1/stats, /metrics and the dashboard
read)."""

from __future__ import annotations

from typing import Protocol

from engine.memory.bandwidth import BandwidthMeter
from engine.runner.compile_count import CompileWatch
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.spec.step import SpecDecoder
from engine.structured.pool import GrammarPool


class StatsSource(Protocol):
    """What engine_stats reads: the LLMEngine's components and counters."""

    scheduler: Scheduler
    block_manager: BlockManager
    grammars: GrammarPool | None
    spec: SpecDecoder | None
    bandwidth: BandwidthMeter
    compiles: CompileWatch
    prompt_tokens_total: int
    generation_tokens_total: int
    num_steps: int


def engine_stats(engine: StatsSource) -> dict:
    """The engine's counters and gauges: what /v1/stats, /metrics and the dashboard read."""
    slots = engine.block_manager.slots
    return {
        "num_running": len(engine.scheduler.running),
        "num_waiting": len(engine.scheduler.waiting) + len(engine.grammars or ()),
        "kv_blocks_used": engine.block_manager.num_used_blocks,
        "kv_blocks_total": engine.block_manager.num_blocks,
        "kv_blocks_cached": engine.block_manager.num_cached_blocks,
        # a hybrid model's state slots (one per running sequence); None without linear layers
        "state_slots_used": slots.num_used if slots is not None else None,
        "state_slots_total": slots.num_slots if slots is not None else None,
        "prefix_caching": engine.block_manager.caching,
        "prefix_cache_queries_total": engine.scheduler.prefix_queries,
        "prefix_cache_hits_total": engine.scheduler.prefix_hits,
        "num_preemptions_total": engine.scheduler.num_preemptions,
        "prompt_tokens_total": engine.prompt_tokens_total,
        "generation_tokens_total": engine.generation_tokens_total,
        "num_steps": engine.num_steps,
        "compiles_after_warmup": engine.compiles.count(),
        "bandwidth": engine.bandwidth.report(),
        "spec_decode": engine.spec.report() if engine.spec is not None else None,
    }
