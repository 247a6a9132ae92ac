"""`appliance profile --measure`: build the planned engine on the GPU with random weights in the
model's shapes, let it warm up (every shape, then the heaviest step: a prefill chunk of
max_num_batched_tokens beside max_num_seqs sampled rows), and show predicted vs measured memory
per item, and whether the KV pool had to shrink.
"""

from __future__ import annotations

import gc
from dataclasses import asdict

from engine.planner import GIB, Device

LABELS = {
    "weights": "weights",
    "activation": "activation peak",
    "graph_pool": "CUDA graph pool",
    "kv_pool": "KV pool",
    "state_pool": "state pool",
    "context": "CUDA context + others",
    "allocator": "allocator cache",
    "peak": "peak in use",
}


def measure_plan(folder: str, config, device: Device):
    """The engine's MemoryReport (engine.memory.memory_check) for a planned EngineConfig on cuda:0,
    planned for `device` (the same plan), with random weights. Its kernels compile into the
    appliance's Triton cache, as `appliance serve`'s do."""
    import torch

    from appliance.triton_cache import triton_cache_env
    from engine.llm_engine import LLMEngine

    triton_cache_env()

    settings = {**asdict(config), "load_format": "random"}
    engine = LLMEngine(folder, device="cuda", device_info=device, **settings)
    report = engine.memory
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return report


def memory_table(report):
    """A rich Table: predicted vs measured, one row per item, then the peak and what the check
    did (in the caption)."""
    from rich.table import Table

    table = Table(title="Predicted vs measured memory (after warm-up)")
    for col in ("item", "predicted", "measured", "difference"):
        table.add_column(col, justify="left" if col == "item" else "right")
    for name, pred, meas in report.rows():
        diff = "n/a" if not pred else f"{100 * (meas - pred) / pred:+.1f}%"
        table.add_row(
            LABELS.get(name, name), f"{pred / GIB:.2f} GiB", f"{meas / GIB:.2f} GiB", diff
        )
    if report.shed_blocks:
        action = (
            f"over the plan by {report.excess / GIB:.2f} GiB: KV pool shrunk from "
            f"{report.num_kv_blocks} to {report.final_blocks} blocks before serving"
        )
    else:
        action = f"within the plan ({report.limit / GIB:.2f} GiB): KV pool kept"
    table.caption = action
    return table


def report_dict(report) -> dict:
    """The report for --json, with the per-item rows spelled out."""
    rows = [{"item": n, "predicted": p, "measured": m} for n, p, m in report.rows()]
    return {**report.to_dict(), "rows": rows}
