"""The plan screen renders what `appliance serve` reports: each planned setting with its reason,
the byte budget, and the memory check after warm-up (predicted vs measured, shrink)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from engine.memory.memory_check import MemoryItems, MemoryReport
from engine.models.model_config import ModelConfig
from engine.planner import GIB, Device, PlanRequest, plan
from tests.support.tui_fakes import make_doc
from tui.model import View
from tui.screens.plan import render

PRESETS = Path(__file__).resolve().parent.parent / "profiles" / "models"


def _text(doc: dict) -> str:
    console = Console(width=160, record=True)
    console.print(render(View(doc=doc)))
    return console.export_text()


def _served_plan() -> dict:
    model = ModelConfig.from_dict(json.loads((PRESETS / "llama-3-8b.json").read_text()))
    result = plan(model, Device(kind="cuda", name="24 GiB", total_bytes=24 * GIB), PlanRequest())
    predicted = MemoryItems(15 * GIB, GIB, GIB // 16, 4 * GIB, GIB // 2)
    measured = MemoryItems(15 * GIB, 2 * GIB, GIB // 16, 4 * GIB, GIB // 2)
    report = MemoryReport(predicted, measured, measured.total, predicted.total, 2000, 37, GIB // 32)
    return {**result.to_dict(), "memory_check": report.to_dict()}


def test_plan_screen_shows_reasons_budget_and_the_memory_check():
    doc = make_doc(1)
    doc["plan"] = _served_plan()
    text = _text(doc)
    assert "Memory plan" in text and "Memory check after warm-up" in text
    quant_reason = doc["plan"]["reasons"]["quantization"]
    assert quant_reason[:40] in text  # each setting with the planner's one-line reason
    assert "KV pool" in text and "safety margin" in text
    check = text.split("Memory check after warm-up")[1].split("Engine configuration")[0]
    rows = {line.split()[0]: line.split()[1:] for line in check.splitlines() if line.strip()}
    assert rows["activation"][:5] == ["1.00", "GiB", "2.00", "GiB", "+100.0%"]
    assert rows["peak"][-1] == "+4.9%"
    assert "KV pool shrunk by 37 blocks to 1963 before serving" in text
    assert "Engine configuration" in text


def test_plan_screen_without_a_plan_or_check_says_so():
    assert "Memory plan: n/a" in _text(make_doc(1))
    doc = make_doc(1)
    doc["plan"] = {**_served_plan(), "memory_check": None}  # a CPU server checks nothing
    text = _text(doc)
    assert "Memory plan" in text and "Memory check" not in text


def test_plan_screen_shows_a_hybrid_models_state_pool_and_hides_a_dense_ones():
    model = ModelConfig.from_dict(json.loads((PRESETS / "qwen3.5-27b.json").read_text()))
    result = plan(model, Device(kind="cuda", name="80 GiB", total_bytes=80 * GIB), PlanRequest())
    items = MemoryItems.from_plan(result)
    report = MemoryReport(items, items, items.total, items.total, result.num_kv_blocks, 0, 1)
    doc = make_doc(1)
    doc["plan"] = {**result.to_dict(), "memory_check": report.to_dict()}
    text = _text(doc)
    lines = [line.split() for line in text.splitlines()]
    assert ["state", "pool", f"{result.state_pool_bytes / GIB:.2f}", "GiB"] in lines
    check = text.split("Memory check after warm-up")[1]
    assert "state_pool" in check
    dense = make_doc(1)
    dense["plan"] = _served_plan()
    assert "state" not in _text(dense).split("Engine configuration")[0]
