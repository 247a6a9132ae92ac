"""What /v1/stats adds for the dashboard: GPU readings (null without a readable GPU, never an
error), KV blocks per request and the share of the largest, rejected and timed-out counts."""

from __future__ import annotations

import asyncio
import types

import torch

from appliance.server.stats import GpuReader
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client


class BlockEngine(FakeEngine):
    """The fake engine, also saying how many KV blocks each running request holds."""

    def kv_blocks_by_request(self) -> dict[str, int]:
        return {r.rid: r.blocks for r in list(self._running)}


async def test_gpu_readings_are_null_on_a_cpu_engine_and_never_fail():
    async with fake_client() as client:
        stats = await (await client.get("/v1/stats")).json()
    assert stats["gpu"] == dict.fromkeys(GpuReader.FIELDS)
    assert GpuReader().read(torch.device("cpu")) == dict.fromkeys(GpuReader.FIELDS)


def fake_nvml(broken: set[str]) -> types.SimpleNamespace:
    def reading(name, value):
        def get(*args):
            if name in broken:
                raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
            return value

        return get

    memory = types.SimpleNamespace(used=3 * 2**30, total=80 * 2**30)
    return types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}",
        nvmlDeviceGetName=reading("name", b"NVIDIA L4"),
        nvmlDeviceGetUtilizationRates=reading("util", types.SimpleNamespace(gpu=42)),
        nvmlDeviceGetMemoryInfo=reading("memory", memory),
        nvmlDeviceGetPowerUsage=reading("power", 71500),
        nvmlDeviceGetTemperature=reading("temp", 55),
        nvmlDeviceGetClockInfo=reading("clock", 2040),
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
    )


def test_gpu_readings_through_nvml_with_unsupported_ones_null(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake_nvml({"power", "clock"}))
    reading = GpuReader().read(torch.device("cuda", 0))
    assert reading == {
        "name": "NVIDIA L4",
        "utilization_perc": 42.0,
        "memory_used_bytes": 3 * 2**30,
        "memory_total_bytes": 80 * 2**30,
        "power_w": None,
        "temperature_c": 55.0,
        "sm_clock_mhz": None,
    }


def test_gpu_reader_survives_nvml_init_failure(monkeypatch):
    def fail():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setitem(__import__("sys").modules, "pynvml", types.SimpleNamespace(nvmlInit=fail))
    assert GpuReader().read(torch.device("cuda", 0)) == dict.fromkeys(GpuReader.FIELDS)


async def test_kv_share_of_the_largest_requests_and_refusal_counts():
    engine = BlockEngine(step_time=0.02, max_num_seqs=4, block_size=4, num_kv_blocks=256)
    async with fake_client(engine, max_queue=1, stall_timeout=0.3) as client:
        sizes = [4, 8, 12, 16]  # prompt tokens; blocks are reserved for prompt + max_tokens
        tasks = [
            asyncio.ensure_future(
                client.post(
                    "/v1/completions",
                    json={"prompt": "w5 " * n, "max_tokens": 40},
                    headers={"X-Request-Id": f"kv-{n}"},
                )
            )
            for n in sizes
        ]
        for _ in range(200):
            stats = await (await client.get("/v1/stats")).json()
            # kv_blocks is null for a request the engine has not admitted yet
            held = {r["id"]: r["kv_blocks"] or 0 for r in stats["requests"]}
            everyone_in = all(held.get(f"kv-{n}", 0) > 0 for n in sizes)
            if everyone_in and sum(held.values()) == stats["kv"]["blocks_used"]:
                break
            await asyncio.sleep(0.01)
        kv = stats["kv"]
        assert [t["id"] for t in kv["top_requests"]] == ["kv-16", "kv-12", "kv-8"]
        assert held["kv-16"] == -(-(16 + 40) // 4) and sum(held.values()) == kv["blocks_used"]
        assert (
            kv["top_share_perc"]
            == 100.0 * sum(t["blocks"] for t in kv["top_requests"]) / (kv["blocks_used"])
        )
        extra = await asyncio.gather(
            *(
                client.post("/v1/completions", json={"prompt": "w5", "max_tokens": 4})
                for _ in range(3)
            )
        )
        assert 429 in [r.status for r in extra]
        await asyncio.gather(*tasks)
        stalled = await client.post("/v1/completions", json={"prompt": "w3 w5", "max_tokens": 9})
        stats = await (await client.get("/v1/stats")).json()
    assert stats["queue"]["rejected_total"] == [r.status for r in extra].count(429)
    assert stalled.status != 200 and stats["queue"]["timed_out_total"] == 1
    assert stats["kv"]["top_requests"] == [] and stats["kv"]["top_share_perc"] == 0.0


async def test_kv_per_request_is_null_when_the_engine_cannot_say():
    async with fake_client(FakeEngine(reports_kv=False)) as client:
        await client.post("/v1/completions", json={"prompt": "w5", "max_tokens": 2})
        stats = await (await client.get("/v1/stats")).json()
    assert stats["kv"]["top_share_perc"] is None
    assert all(r["kv_blocks"] is None for r in stats["requests"])
