"""One reader of NVML and CUDA_VISIBLE_DEVICES (engine.planner.nvml) for the profile's probe
and the server's GPU readings: both find the device CUDA numbers as this process does, by index
or UUID, and neither finds a device the variable hides."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from appliance import probe as probe_mod
from appliance.server.stats import GpuReader
from engine.planner import GIB, nvml


def fake_nvml() -> SimpleNamespace:
    """Four GPUs: physical index i is "GPU-i" and named "card i"; handles say which."""

    def by_uuid(uuid: str) -> str:
        if not uuid.startswith(("GPU-", "MIG-")) or uuid[4:] not in "0123":
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return f"h{uuid[4:]}"

    def by_index(i: int) -> str:
        if not 0 <= i < 4:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return f"h{i}"

    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=by_index,
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetName=lambda h: f"card {h[1:]}".encode(),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(
            total=(int(h[1:]) + 1) * 16 * GIB, free=8 * GIB, used=GIB
        ),
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=int(h[1:])),
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 2619,
        nvmlDeviceGetMemoryBusWidth=lambda h: 5120,
        nvmlSystemGetDriverVersion=lambda: "570.1",
        NVML_CLOCK_MEM=2,
    )


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())


@pytest.mark.parametrize(
    "visible, index, found",
    [
        (None, 0, "h0"),
        (None, 2, "h2"),
        ("2,3", 0, "h2"),
        ("2,3", 1, "h3"),
        ("GPU-3,GPU-1", 1, "h1"),
        ("MIG-2", 0, "h2"),
        ("2,3", 2, None),  # the variable lists two devices
        ("", 0, None),  # it hides every device
    ],
)
def test_the_handle_follows_cuda_visible_devices(monkeypatch, four_gpus, visible, index, found):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert nvml.handle(nvml.load(), index) == found


def test_torchs_uuid_wins_over_the_variable(monkeypatch, four_gpus):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert nvml.handle(nvml.load(), 0, uuid="1") == "h1"
    assert nvml.handle(nvml.load(), 0, uuid="GPU-2") == "h2"


def test_probe_and_stats_read_the_same_device(monkeypatch, four_gpus):
    """With CUDA_VISIBLE_DEVICES=GPU-2,0, cuda:0 is physical GPU 2 for both readers."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-2,0")
    gpu = probe_mod.GpuProbe()
    probe_mod._probe_nvml(gpu, None, [])
    assert gpu.name == "card 2" and gpu.total_bytes == 48 * GIB
    reading = GpuReader().read("cuda:0")
    assert reading["name"] == "card 2" and reading["utilization_perc"] == 2.0
    assert GpuReader().read("cuda:1")["name"] == "card 0"


def test_a_hidden_device_reads_as_nothing(monkeypatch, four_gpus):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpu = probe_mod.GpuProbe(torch_cuda=True)
    problems: list[str] = []
    probe_mod._probe_nvml(gpu, None, problems)
    assert gpu.name is None and problems == ["NVML could not find the GPU torch uses"]
    assert GpuReader().read("cuda:0") == dict.fromkeys(GpuReader.FIELDS)


def test_no_nvml_reads_as_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert GpuReader().read("cuda:0") == dict.fromkeys(GpuReader.FIELDS)
