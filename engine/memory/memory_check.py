"""The plan's memory check after warm-up: what each item was predicted to take and what it took
(MemoryItems, MemoryReport), how the CUDA measurement reads the allocator, and how many KV
blocks cover an excess. The model runner runs the check (ModelRunner.check_memory) and shrinks
its pool before serving when the measured peak exceeds the plan.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import torch

GIB = 1024**3


@dataclass
class MemoryItems:
    """Device memory by item, bytes. `context`: what the caching allocator does not manage
    (CUDA context, library workspaces, other processes). `allocator`: what the allocator holds
    at the peak beyond live tensors (blocks cached between steps of other shapes).
    `state_pool`: a hybrid model's linear-attention state slots (0 for other models)."""

    weights: int = 0
    activation: int = 0
    graph_pool: int = 0
    kv_pool: int = 0
    context: int = 0
    allocator: int = 0
    state_pool: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    @classmethod
    def from_plan(cls, plan) -> MemoryItems:
        """The prediction of an engine.planner Plan: memory other processes held when planning
        is counted with the context, as measured."""
        return cls(
            weights=plan.weight_bytes + plan.draft_weight_bytes + plan.vision_weight_bytes,
            activation=plan.activation_bytes + plan.vision_activation_bytes,
            graph_pool=plan.graph_pool_bytes,
            kv_pool=plan.kv_pool_bytes,
            context=plan.cuda_context_bytes + max(0, plan.others_bytes),
            allocator=plan.allocator_bytes,
            state_pool=plan.state_pool_bytes,
        )


@dataclass
class Measurement:
    items: MemoryItems
    peak: int
    """Peak device memory in use: `context` plus the allocator's peak reservation."""


@dataclass
class MemoryReport:
    """Predicted vs measured memory after warm-up, and what was done about it."""

    predicted: MemoryItems
    measured: MemoryItems
    measured_peak: int
    limit: int
    """The plan's total: a measured peak above it sheds KV blocks."""
    num_kv_blocks: int
    """Blocks planned before the check."""
    shed_blocks: int
    block_bytes: int

    def rows(self) -> list[tuple[str, int, int]]:
        """(item, predicted, measured) per item (the state pool only where there is one), then
        the total."""
        out = [
            (f.name, getattr(self.predicted, f.name), getattr(self.measured, f.name))
            for f in fields(MemoryItems)
        ]
        out = [row for row in out if row[0] != "state_pool" or row[1] or row[2]]
        out.append(("peak", self.predicted.total, self.measured_peak))
        return out

    def lines(self) -> list[str]:
        lines = []
        for name, pred, meas in self.rows():
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


def measure_cuda(runner, workload: Callable[[], None]) -> Measurement:
    """Choose kernels, capture graphs and run the workload (warm-up: every shape, then the
    heaviest step) on CUDA, reading the allocator around each: graph pool = reservation growth
    of the capture; activation = peak of live tensors during the workload above those alive
    before it; allocator = the peak reservation beyond the activation, the graph pool, the
    weights and the KV pool. The peak itself is read from the reservation."""
    dev = runner.device
    runner.choose_kernels()  # its timing temporaries are freed before the pool is read
    torch.cuda.synchronize(dev)
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(dev)
    runner.capture_cuda_graphs()
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_reserved(dev)
    live_before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    workload()
    torch.cuda.synchronize(dev)
    peak_reserved = torch.cuda.max_memory_reserved(dev)
    activation = torch.cuda.max_memory_allocated(dev) - live_before
    free, total = torch.cuda.mem_get_info(dev)
    outside = total - free - torch.cuda.memory_reserved(dev)
    weights = sum(
        sum(t.nbytes for t in model.parameters()) + sum(t.nbytes for t in model.buffers())
        for model in runner.models()
    )
    kv = runner.kv_pool_bytes
    state = runner.state_pool_bytes
    graph_pool = base - before
    allocator = max(0, peak_reserved - weights - kv - state - activation - graph_pool)
    items = MemoryItems(weights, activation, graph_pool, kv, outside, allocator, state)
    return Measurement(items, outside + peak_reserved)
