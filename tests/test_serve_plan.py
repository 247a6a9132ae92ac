"""`appliance serve` runs the memory planner once, in its engine core: pins reach it, the plan
the core reports is the one the front end logs and /v1/stats serves, a pin that cannot fit is
refused before any weight loads; and the profile's predicted-vs-measured table."""

from __future__ import annotations

import json
import logging
import time
import urllib.request

from aiohttp.test_utils import TestClient, TestServer
from rich.console import Console

from appliance.cli import main
from appliance.profile_measure import memory_table, report_dict
from appliance.server import create_app
from appliance.settings import ServeSettings
from engine.memory.memory_check import MemoryItems, MemoryReport
from engine.planner import GIB, Device, Plan, plan_settings
from tests.support.fake_server import wait_until_served
from tests.support.serve_process import start_server

MIB = 1024**2


def planned(settings: ServeSettings) -> Plan:
    """The plan an engine makes for `settings` on this machine's CPU, as the engine core of
    `appliance serve` makes it."""
    from engine.config import EngineConfig
    from engine.models.loader import resolve_model_folder
    from engine.models.model_config import ModelConfig
    from engine.startup.planned_config import plan_engine

    pins = EngineConfig.from_kwargs(**settings.engine_kwargs())
    model = ModelConfig.from_folder(resolve_model_folder(settings.model))
    return plan_engine(pins, model, "cpu")[0]


def test_pins_reach_the_planner_and_the_rest_is_planned():
    p = planned(ServeSettings(device="cpu", max_model_len=1024, enforce_eager=True))
    assert p.reasons["max_model_len"] == "pinned" and p.reasons["max_num_seqs"] != "pinned"
    assert p.block_size == 16 and p.reasons["num_kv_blocks"] != "pinned"
    p = planned(ServeSettings(device="cpu", max_model_len=1024))
    assert p.device == "cpu" and p.max_model_len == 1024 and p.reasons["max_model_len"] == "pinned"
    assert p.max_num_seqs == 16  # the CPU class's cap
    # the CPU pool holds the worst case (every sequence at max_model_len), no more
    assert p.num_kv_blocks == p.max_num_seqs * 1024 // p.block_size


async def test_the_server_logs_and_serves_the_plan_its_engine_runs(caplog):
    """Planned once, in the engine core: the front end's plan lines are the plan /v1/stats
    serves and the configuration the engine runs, in a CPU plan's words."""
    settings = ServeSettings(device="cpu", max_model_len=1024, warmup=False)
    with caplog.at_level(logging.INFO, logger="appliance.plan"):
        async with TestClient(TestServer(create_app(settings))) as client:
            await wait_until_served(client)
            stats = await (await client.get("/v1/stats")).json()
    logged = [r.getMessage() for r in caplog.records if r.name == "appliance.plan"]
    plan, config = stats["plan"], stats["config"]
    assert logged == [f"plan: {n} = {v} ({why})" for n, v, why in plan_settings(plan)]
    assert plan["max_model_len"] == config["max_model_len"] == 1024
    assert "plan: max_model_len = 1024 (pinned)" in logged
    for key in ("max_num_seqs", "num_kv_blocks", "max_num_batched_tokens", "dtype"):
        assert config[key] == plan[key], key
    assert any(line.startswith("plan: memory_utilization = 0.5 (") for line in logged)
    assert not any("gpu" in line.lower() for line in logged)


def test_unpinned_cpu_plan_keeps_the_kv_pool_small():
    p = planned(ServeSettings(device="cpu"))
    assert p.kv_pool_bytes <= 2 * GIB  # not many GiB of zeros on a shared 24 GB machine
    assert p.num_kv_blocks * p.block_size >= p.max_model_len


def test_a_pin_that_cannot_fit_fails_fast_naming_the_number(capsys):
    start = time.monotonic()
    code = main(["serve", "--device", "cpu", "--port", "0", "--num-kv-blocks", "10000000"])
    assert code == 2
    assert time.monotonic() - start < 30  # planned from config.json: no model load
    err = capsys.readouterr().err.strip()
    assert "num_kv_blocks=10000000 needs" in err
    assert err.count("set ") == 1 and "set num_kv_blocks to " in err


def test_serve_runs_the_plan_on_the_cpu():
    proc, url = start_server("--max-model-len", "1024", "--log-level", "warning")
    try:
        with urllib.request.urlopen(f"{url}/v1/stats", timeout=30) as resp:
            stats = json.load(resp)
    finally:
        proc.kill()
        proc.wait(30)
    plan, config = stats["plan"], stats["config"]
    assert plan["device"] == "cpu" and plan["memory_check"] is None
    for key in ("max_model_len", "max_num_seqs", "num_kv_blocks", "max_num_batched_tokens"):
        assert config[key] == plan[key], key
    assert config["max_model_len"] == 1024 and plan["reasons"]["max_model_len"] == "pinned"
    assert config["max_num_seqs"] == 16  # planned: the engine's own default is 64
    assert 134e6 < plan["num_params"] == plan["num_active_params"] < 135e6  # SmolLM2-135M
    assert stats["model_params"] == {"total": plan["num_params"], "active": plan["num_params"]}


def fake_report(shed: int) -> MemoryReport:
    predicted = MemoryItems(15 * GIB, GIB // 2, 300 * MIB, 4 * GIB, GIB // 2)
    measured = MemoryItems(15 * GIB, GIB, 280 * MIB, 4 * GIB, 600 * MIB)
    peak = measured.total if shed else predicted.total - MIB
    return MemoryReport(predicted, measured, peak, predicted.total, 2000, shed, 2 * MIB)


def render(report: MemoryReport) -> str:
    console = Console(width=120, record=True)
    console.print(memory_table(report))
    return " ".join(console.export_text().split())  # the caption wraps at the table's width


def test_profile_table_shows_predicted_vs_measured_per_item():
    text = render(fake_report(shed=0))
    for label in ("weights", "activation peak", "CUDA graph pool", "KV pool", "peak in use"):
        assert label in text
    assert "0.50 GiB" in text and "1.00 GiB" in text and "+100.0%" in text  # activation
    assert "-6.7%" in text  # graph pool: 280 of 300 MiB
    assert "within the plan" in text and "KV pool kept" in text


def test_profile_table_says_when_the_pool_was_shrunk():
    report = fake_report(shed=300)
    text = render(report)
    assert "shrunk from 2000 to 1700 blocks before serving" in text
    rows = report_dict(report)["rows"]
    assert [r["item"] for r in rows][-1] == "peak" and rows[0]["predicted"] == 15 * GIB
    json.dumps(report_dict(report))


def test_a_long_context_model_on_a_24gib_card_gets_the_length_that_fits(monkeypatch, tmp_path):
    """LLM() with no settings on a 24 GiB card and a 131,072-token model plans the longest
    max_model_len its KV pool holds twice (it used to take the model's maximum and raise)."""
    from appliance.model_presets import load_preset
    from engine.config import EngineConfig
    from engine.models.model_config import ModelConfig
    from engine.startup.planned_config import plan_engine

    config = {**load_preset("llama-3-8b"), "max_position_embeddings": 131072}
    card = Device(kind="cuda", name="24 GiB", total_bytes=24 * GIB, max_num_batched_tokens=2048)
    monkeypatch.setattr("engine.startup.planned_config.read_device", lambda kind: card)
    plan, resolved = plan_engine(EngineConfig(), ModelConfig.from_dict(config), "cuda")
    assert 8192 <= plan.max_model_len < 131072 and plan.concurrency_at_max_len >= 2
    assert resolved.max_model_len == plan.max_model_len and resolved.num_kv_blocks > 0
    assert "the longest with memory for" in plan.reasons["max_model_len"]
