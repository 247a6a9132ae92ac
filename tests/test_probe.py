"""The probe never crashes (pynvml missing, failing or partial), GPU class profiles match the
right cards, and `appliance profile` prints a table and valid JSON on this machine."""

from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace

import pytest

from appliance import probe as probe_mod
from appliance.model_presets import load_preset
from appliance.probe import GpuProbe
from appliance.profile_cmd import add_profile_parser, run_profile
from engine.config import EngineConfig
from engine.models.model_config import ModelConfig
from engine.planner import GIB, plan
from engine.planner import device as device_mod
from engine.planner.device import (
    DeviceReadings,
    device_for,
    load_gpu_profiles,
    match_gpu_profile,
)

PROFILES = load_gpu_profiles()


def fake_nvml(fail: tuple[str, ...] = (), name: str = "NVIDIA GeForce RTX 4090") -> SimpleNamespace:
    def reading(fn_name, value):
        def fn(*args):
            if fn_name in fail:
                raise RuntimeError(f"{fn_name}: Not Supported")
            return value

        return fn

    mem = SimpleNamespace(total=24 * GIB, free=20 * GIB, used=4 * GIB)
    readings = {
        "nvmlInit": None,
        "nvmlShutdown": None,
        "nvmlDeviceGetHandleByIndex": "h",
        "nvmlDeviceGetHandleByUUID": "h",
        "nvmlDeviceGetName": name.encode(),
        "nvmlDeviceGetMemoryInfo": mem,
        "nvmlDeviceGetMaxClockInfo": 10501,
        "nvmlDeviceGetMemoryBusWidth": 384,
        "nvmlDeviceGetCudaComputeCapability": (8, 9),
        "nvmlSystemGetDriverVersion": "570.1",
    }
    return SimpleNamespace(NVML_CLOCK_MEM=2, **{k: reading(k, v) for k, v in readings.items()})


def no_torch_gpu(monkeypatch):
    monkeypatch.setattr(probe_mod, "_probe_torch", lambda problems: (None, None))


def fake_torch_gpu(monkeypatch, name: str, total_gib: float):
    """A GPU torch can use, for the probe's report and for the planner's device reading."""
    total = int(total_gib * GIB)
    gpu = GpuProbe(
        name=name,
        total_bytes=total,
        compute_capability=(8, 0),
        bf16_supported=True,
        num_sms=108,
        torch_cuda=True,
    )
    monkeypatch.setattr(probe_mod, "_probe_torch", lambda problems: (gpu, "1234"))
    readings = DeviceReadings("cuda", name, total, total, bf16_supported=True)
    monkeypatch.setattr(device_mod, "read_cuda", lambda: readings)


def test_probe_without_pynvml_is_a_cpu_probe_with_nothing_to_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    no_torch_gpu(monkeypatch)
    found = probe_mod.probe()
    assert found.device == "cpu" and found.gpu is None and found.profile.key == "cpu"
    assert found.problems == []  # no GPU, no NVML: a CPU machine, not a problem


def test_a_gpu_without_nvml_is_noted(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    fake_torch_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", 80)
    found = probe_mod.probe()
    assert found.device == "cuda" and any("NVML unavailable" in p for p in found.problems)


def test_probe_survives_nvml_init_failure(monkeypatch):
    nvml = fake_nvml(fail=("nvmlInit",))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    fake_torch_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", 80)
    found = probe_mod.probe()
    assert found.device == "cuda" and found.gpu.bandwidth_gbs is None
    assert found.gpu.free_bytes is None and found.profile.key == "a100-80g"


def test_device_fills_what_was_not_read_from_the_class_profile():
    readings = DeviceReadings("cuda", "NVIDIA A100-SXM4-80GB", 80 * GIB)  # no free memory read
    device = device_for(readings, PROFILES)
    assert device.bandwidth_gbs == 2039 and device.used_bytes == 0  # from the class profile
    assert device.profile == "a100-80g" and device.max_num_batched_tokens > 0


def test_probe_with_partial_nvml_readings(monkeypatch):
    fail = ("nvmlDeviceGetMemoryBusWidth", "nvmlSystemGetDriverVersion", "nvmlDeviceGetName")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=fail))
    fake_torch_gpu(monkeypatch, "NVIDIA GeForce RTX 4090", 24)
    found = probe_mod.probe()
    gpu = found.gpu
    assert gpu.bandwidth_gbs is None and gpu.driver_version is None
    assert gpu.free_bytes == 20 * GIB and found.profile.key == "rtx-4090"


def test_device_counts_what_other_processes_hold():
    readings = DeviceReadings("cuda", "NVIDIA GeForce RTX 4090", 24 * GIB, 20 * GIB)
    assert device_for(readings, PROFILES).used_bytes == 4 * GIB
    # this process's own context (the class's 0.5 GiB) is planned as an item, not as used
    own = DeviceReadings(
        "cuda", "NVIDIA GeForce RTX 4090", 24 * GIB, int(19.5 * GIB), has_own_context=True
    )
    assert device_for(own, PROFILES).used_bytes == 4 * GIB


def test_nvml_gpu_without_torch_cuda_plans_for_the_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    no_torch_gpu(monkeypatch)
    found = probe_mod.probe()
    assert found.gpu.name == "NVIDIA GeForce RTX 4090" and not found.gpu.torch_cuda
    assert found.gpu.bandwidth_gbs == pytest.approx(1008, rel=0.001)  # 10501 MHz x 2 x 384 bit
    assert found.device == "cpu" and any("torch has no CUDA" in p for p in found.problems)


def test_probe_cpu_survives_psutil_failure(monkeypatch):
    import psutil

    def broken(*args):
        raise OSError("no /proc")

    monkeypatch.setattr(psutil, "virtual_memory", broken)
    monkeypatch.setattr(psutil, "cpu_count", broken)
    cpu = probe_mod.probe_cpu()
    assert cpu.total_ram_bytes is None and cpu.num_cores is None
    with pytest.raises(ValueError, match="RAM"):
        device_mod.read_device("cpu")


def test_every_gpu_class_has_a_profile():
    geforce = {"rtx-3060-12g", "rtx-3090", "rtx-4060-ti-16g", "rtx-4070", "rtx-4090", "rtx-5090"}
    others = {"a10", "l4", "t4", "a100-40g", "a100-80g", "h100", "h200", "jetson-orin", "cpu"}
    expected = geforce | others
    assert set(PROFILES) == expected
    assert not PROFILES["t4"].bf16_supported and PROFILES["h200"].bf16_tflops > 900


@pytest.mark.parametrize(
    ("name", "gib", "key"),
    [
        ("NVIDIA GeForce RTX 4090", 23.99, "rtx-4090"),
        ("NVIDIA A100-PCIE-40GB", 40, "a100-40g"),
        ("NVIDIA A100-SXM4-80GB", 80, "a100-80g"),
        ("NVIDIA A10", 22.5, "a10"),
        ("NVIDIA A10G", 22.3, "a10"),
        ("NVIDIA L4", 22.5, "l4"),
        ("NVIDIA L40S", 45, None),
        ("Tesla T4", 15, "t4"),
        ("NVIDIA H100 80GB HBM3", 79.6, "h100"),
        ("NVIDIA H200", 140, "h200"),
        ("Orin", 61.4, "jetson-orin"),
        ("NVIDIA GeForce RTX 4060 Ti", 8, None),
        ("NVIDIA GeForce RTX 4060 Ti", 16, "rtx-4060-ti-16g"),
        ("NVIDIA GeForce RTX 4070 Ti", 12, None),
        ("NVIDIA GeForce RTX 4070", 12, "rtx-4070"),
        ("NVIDIA GeForce RTX 3060", 12, "rtx-3060-12g"),
        ("NVIDIA GeForce RTX 3090", 24, "rtx-3090"),
        ("NVIDIA GeForce RTX 5090", 31.4, "rtx-5090"),
    ],
)
def test_gpu_class_matching(name, gib, key):
    found = match_gpu_profile(name, int(gib * GIB), PROFILES)
    assert (found.key if found else None) == key


@pytest.mark.parametrize("key", sorted(k for k in PROFILES if k != "cpu"))
def test_every_class_plans_llama3_8b_from_its_profile_alone(key):
    readings = DeviceReadings("cuda", PROFILES[key].name)  # nothing readable but the name
    p = plan(ModelConfig.from_dict(load_preset("llama-3-8b")), device_for(readings, PROFILES))
    memory = PROFILES[key].memory_gib
    # 16 GiB of bf16 weights need a 22 GiB class; int8 fits 15-16 GiB; int4 the 12 GiB ones
    expected = "none" if memory >= 22 else "int8" if memory >= 15 else "int4"
    assert p.target_met and p.quantization == expected, (p.quantization, p.reasons)
    EngineConfig(**p.engine_kwargs())


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="appliance")
    add_profile_parser(parser.add_subparsers(dest="command"))
    return run_profile(parser.parse_args(argv))


def test_profile_prints_a_table_for_the_embedded_model(capsys):
    assert run(["profile", "--measure"]) == 0
    out = capsys.readouterr().out
    for text in ("Memory plan", "KV bytes / token", "concurrency", "max_model_len", "cpu:"):
        assert text in out, text
    assert "--measure needs a CUDA GPU" in out


def test_a_cpu_plan_speaks_of_no_gpu(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    no_torch_gpu(monkeypatch)
    assert run(["profile"]) == 0
    out = capsys.readouterr().out
    assert "gpu" not in out.lower() and "cuda" not in out.lower()
    assert "memory_utilization" in out and "share of the available RAM" in out


def test_profile_shows_n_a_for_what_nvml_cannot_read(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=("nvmlInit",)))
    fake_torch_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", 80)
    assert run(["profile", "--model", "llama-3-8b"]) == 0
    out = capsys.readouterr().out
    assert "n/a" in out and "NVIDIA A100 80 GB" in out and "cuda:" in out


def test_profile_shows_total_and_active_params_and_the_active_floor(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=("nvmlInit",)))
    fake_torch_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", 80)
    assert run(["profile", "--model", "qwen3-30b-a3b"]) == 0
    out = capsys.readouterr().out
    # the preset's vocabulary is cut to the embedded tokenizer's (appliance/model_presets.py)
    assert "30.11 B params, 2.93 B active" in out and "(active weights + KV)" in out
    assert run(["profile", "--model", "llama-3-8b"]) == 0
    out = capsys.readouterr().out
    assert " B params, " in out and "active" not in out and "(weights + KV)" in out


def test_profile_json_is_valid_and_builds_an_engine_config(capsys):
    assert run(["profile", "--json", "--measure"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4  # SmolLM2-135M, float32
    assert report["plan"]["num_kv_blocks"] > 0 and report["measured"] is None
    EngineConfig(**report["engine_config"])


def test_profile_refusal_exits_2_with_one_message(capsys):
    assert run(["profile", "--model", "llama-2-7b", "--max-model-len", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("set max_model_len to 4096")
    assert run(["profile", "--json", "--model", "llama-2-7b", "--max-model-len", "100000"]) == 2
    assert json.loads(capsys.readouterr().out)["setting"] == "max_model_len"
