"""The KV pool's final size: allocate it, capture graphs, warm up every shape, read the real peak
memory, compare it with the plan item by item, and shrink the pool before serving (never after)
when the measurement exceeds the plan.

Order matters: decode CUDA graphs bake in the KV tensor's address, so a shrunk pool is
re-allocated first and the graphs are captured again after it; the block manager and scheduler
are built for the final block count. On the CPU nothing is measured (no device allocator to
read) unless a test passes its own `measure`.
"""

from __future__ import annotations

import gc
import logging
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import torch

from engine.block_manager import BlockManager
from engine.memory_cap import apply_memory_cap, usable_mem_info
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler

logger = logging.getLogger("engine.memory")
GIB = 1024**3
KV_TENSORS = ("k_cache", "v_cache", "k_scales", "v_scales")
"""Attention-layer attributes that hold views of the KV pool."""


@dataclass
class MemoryItems:
    """Device memory by item, bytes. `context`: what the caching allocator does not manage
    (CUDA context, library workspaces, other processes)."""

    weights: int = 0
    activation: int = 0
    graph_pool: int = 0
    kv_pool: int = 0
    context: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    @classmethod
    def from_plan(cls, plan) -> MemoryItems:
        """The prediction of a planner's Plan (appliance.plan_model.Plan or alike): memory
        other processes held when planning is counted with the context, as measured."""
        others = int(plan.total_bytes * plan.gpu_memory_utilization) - plan.budget_bytes
        return cls(
            weights=plan.weight_bytes,
            activation=plan.activation_bytes,
            graph_pool=plan.graph_pool_bytes,
            kv_pool=plan.kv_pool_bytes,
            context=plan.cuda_context_bytes + max(0, others),
        )


@dataclass
class Measurement:
    items: MemoryItems
    peak: int
    """Peak device memory in use: `context` plus the allocator's peak reservation."""


@dataclass
class MemoryReport:
    """Predicted vs measured memory after warm-up, and what was done about it."""

    predicted: MemoryItems | None
    measured: MemoryItems
    measured_peak: int
    limit: int
    """The plan's total (or the usable memory x utilization without a plan)."""
    num_kv_blocks: int
    """Blocks planned before the check."""
    shed_blocks: int
    block_bytes: int

    def rows(self) -> list[tuple[str, int | None, int]]:
        """(item, predicted or None, measured) per item, then the total."""
        out = []
        for f in fields(MemoryItems):
            pred = getattr(self.predicted, f.name) if self.predicted else None
            out.append((f.name, pred, getattr(self.measured, f.name)))
        total = self.predicted.total if self.predicted else None
        out.append(("peak", total, self.measured_peak))
        return out

    def lines(self) -> list[str]:
        lines = []
        for name, pred, meas in self.rows():
            if pred is None:
                lines.append(f"memory {name}: measured {meas / GIB:.2f} GiB")
                continue
            diff = f"{100 * (meas - pred) / pred:+.1f}%" if pred else "n/a"
            lines.append(
                f"memory {name}: predicted {pred / GIB:.2f} GiB, measured {meas / GIB:.2f} GiB "
                f"({diff})"
            )
        if self.shed_blocks:
            lines.append(
                f"memory: measured peak exceeds the plan by {self.excess / GIB:.2f} GiB: KV pool "
                f"shrunk from {self.num_kv_blocks} to {self.final_blocks} blocks before serving"
            )
        else:
            lines.append(f"memory: measured peak within the plan ({self.limit / GIB:.2f} GiB)")
        return lines

    @property
    def excess(self) -> int:
        return self.measured_peak - self.limit

    @property
    def final_blocks(self) -> int:
        return self.num_kv_blocks - self.shed_blocks

    def to_dict(self) -> dict:
        return {**asdict(self), "final_blocks": self.final_blocks}


def blocks_to_shed(measured_peak: int, limit: int, block_bytes: int) -> int:
    """Whole KV blocks whose memory covers the measured excess over the limit (0 if none)."""
    excess = measured_peak - limit
    return 0 if excess <= 0 else -(-excess // block_bytes)


def settle_kv_pool(
    engine,
    predicted: MemoryItems | None = None,
    measure: Callable[[object], Measurement] | None = None,
) -> MemoryReport | None:
    """Allocate the pool and build the scheduler; on CUDA (or with `measure`), capture graphs,
    warm up, measure, and shrink the pool when the peak exceeds the prediction. Raises
    ValueError, naming the setting to change, when even a shrunk pool cannot hold one
    max_model_len sequence."""
    cfg, runner = engine.config, engine.runner
    is_cuda = engine.device.type == "cuda"
    if is_cuda:
        apply_memory_cap(engine.device)
    _allocate(engine, cfg.num_kv_blocks)
    measure = measure or (measure_cuda if is_cuda else None)
    if measure is None:
        return None
    got = measure(engine)  # captures the graphs and warms up
    if predicted is not None:
        limit = predicted.total
    else:
        limit = int(usable_mem_info(engine.device)[1] * cfg.gpu_memory_utilization)
    block_bytes = max(1, got.items.kv_pool // cfg.num_kv_blocks)
    shed = blocks_to_shed(got.peak, limit, block_bytes)
    report = MemoryReport(predicted, got.items, got.peak, limit, cfg.num_kv_blocks, shed,
                          block_bytes)  # fmt: skip
    for line in report.lines():
        logger.info(line)
    if shed:
        keep = cfg.num_kv_blocks - shed
        if keep * cfg.block_size < cfg.max_model_len:
            raise ValueError(
                f"after warm-up the engine needs {report.excess / GIB:.2f} GiB more than planned "
                f"and the KV pool cannot shrink below one max_model_len={cfg.max_model_len} "
                f"sequence: set max_model_len to {max(0, keep) * cfg.block_size // 256 * 256}"
            )
        runner.graphs = None  # they point at the old pool
        _release(engine)
        cfg.num_kv_blocks = keep
        _allocate(engine, keep)
        runner.capture_cuda_graphs()
    return report


def _allocate(engine, num_blocks: int) -> None:
    engine.runner.allocate_kv_cache(num_blocks, engine.kv_dtype)
    engine.block_manager = BlockManager(num_blocks, engine.config.block_size)
    engine.scheduler = Scheduler(engine.config, engine.block_manager)


def _release(engine) -> None:
    """Drop every reference to the pool, so the smaller one never sits beside it."""
    runner = engine.runner
    for attn in runner.model.attention_layers():
        for name in KV_TENSORS:
            if hasattr(attn, name):
                setattr(attn, name, None)
    runner.kv_cache = torch.empty(0)
    if hasattr(runner, "kv_scales"):
        runner.kv_scales = None
    gc.collect()
    if engine.device.type == "cuda":
        torch.cuda.empty_cache()


def kv_pool_bytes(runner) -> int:
    scales = getattr(runner, "kv_scales", None)
    return runner.kv_cache.nbytes + (scales.nbytes if scales is not None else 0)


def measure_cuda(engine) -> Measurement:
    """Capture graphs and warm up (every shape, then the heaviest step) on CUDA, reading the
    allocator around each: graph pool = reservation growth of the capture, activation peak =
    peak of live tensors during the warm-up above those alive before it. (Reservation growth
    read ~0 under a memory cap, where the allocator frees cached blocks instead of growing:
    H200 with a 24 GiB cap, 2026-11-29. The peak itself is read from the reservation.)"""
    dev, runner = engine.device, engine.runner
    torch.cuda.synchronize(dev)
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(dev)
    runner.capture_cuda_graphs()
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_reserved(dev)
    live_before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    engine.warm_up()
    run_peak_step(engine)
    torch.cuda.synchronize(dev)
    peak_reserved = torch.cuda.max_memory_reserved(dev)
    activation = torch.cuda.max_memory_allocated(dev) - live_before
    free, total = torch.cuda.mem_get_info(dev)
    outside = total - free - torch.cuda.memory_reserved(dev)
    weights = sum(t.nbytes for t in runner.model.parameters())
    weights += sum(t.nbytes for t in runner.model.buffers())
    items = MemoryItems(weights, activation, base - before, kv_pool_bytes(runner),
                        outside)  # fmt: skip
    return Measurement(items, outside + peak_reserved)


def run_peak_step(engine) -> None:
    """The heaviest steps serving can meet: max_num_seqs sequences at once, the long ones
    filling the step's token budget (several where max_model_len is shorter than it), every one
    sampled with every sampling feature (penalties, top-k/top-p/min-p, logprobs), so the
    logits and sampler temporaries peak."""
    cfg = engine.config
    vocab = engine.model_config.vocab_size
    gen = random.Random(1)
    params = SamplingParams(
        max_tokens=2, temperature=0.8, top_p=0.9, top_k=50, min_p=0.01,
        repetition_penalty=1.1, presence_penalty=0.1, frequency_penalty=0.1,
        logprobs=5, ignore_eos=True, seed=0,
    )  # fmt: skip
    longs = cfg.budget_prompt_lengths(params.max_tokens) or [1]
    for i in range(cfg.max_num_seqs - len(longs)):
        engine.add_request(f"__peak-{i}", [gen.randrange(vocab)], params)
    for i, n in enumerate(longs):
        engine.add_request(f"__peak-long-{i}", [gen.randrange(vocab) for _ in range(n)], params)
    while engine.has_unfinished():
        engine.step()
    engine.num_steps = engine.prompt_tokens_total = engine.generation_tokens_total = 0
    engine.scheduler.num_preemptions = 0
