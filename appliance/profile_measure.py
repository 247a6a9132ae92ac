"""`appliance profile --measure`: build the planned engine on the GPU with random weights in the
model's shapes, let it warm up (every shape, then the heaviest step: a prefill chunk of
max_num_batched_tokens beside max_num_seqs sampled rows), and show predicted vs measured memory
per item. The measured activation peak then replaces the estimate in the printed plan.
"""

from __future__ import annotations

import gc
import json
import tempfile
from pathlib import Path

from appliance.model_presets import PRESETS_DIR
from appliance.plan_model import GIB, Plan

LABELS = {
    "weights": "weights",
    "activation": "activation peak",
    "graph_pool": "CUDA graph pool",
    "kv_pool": "KV pool",
    "context": "CUDA context + others",
    "peak": "peak in use",
}


def measure_plan(model: str | None, p: Plan, enforce_eager: bool = False):
    """The engine's MemoryReport (engine.memory_check) for the plan on cuda:0."""
    import torch

    from engine.llm_engine import LLMEngine
    from engine.memory_check import MemoryItems

    with tempfile.TemporaryDirectory() as tmp:
        folder = model
        if model is not None and (PRESETS_DIR / f"{model}.json").is_file():
            folder = tmp  # a preset is a config.json alone: enough for random weights
            config = json.loads((PRESETS_DIR / f"{model}.json").read_text())
            (Path(tmp) / "config.json").write_text(json.dumps(config))
        engine = LLMEngine(
            folder,
            device="cuda",
            predicted_memory=MemoryItems.from_plan(p),
            load_format="random",
            enforce_eager=enforce_eager,
            **p.engine_kwargs(),
        )
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
        shown = "n/a" if pred is None else f"{pred / GIB:.2f} GiB"
        table.add_row(LABELS.get(name, name), shown, f"{meas / GIB:.2f} GiB", diff)
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
