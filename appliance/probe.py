"""The hardware probe behind `appliance profile`'s report: what GPU (or CPU) is here, read
through NVML (engine.planner.nvml), torch and psutil, and its GPU class profile
(profiles/gpus/*.toml).

Every reading is optional: a value the hardware, the driver or a missing library cannot give
is None (shown as n/a), never an exception. No visible CUDA GPU gives a CPU probe. What the
planner plans for is engine.planner.read_device's Device, the same for every entry point; the
probe adds what only NVML and psutil know (bandwidth, driver, cores) to the report.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.planner import nvml
from engine.planner.device import GpuProfile, load_gpu_profiles, match_gpu_profile


@dataclass
class GpuProbe:
    """Readings of the first visible CUDA device; None = could not be read."""

    name: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    bf16_supported: bool | None = None
    bandwidth_gbs: float | None = None
    """Peak memory bandwidth from NVML: max memory clock x 2 (double data rate) x bus width."""
    num_sms: int | None = None
    driver_version: str | None = None
    torch_cuda: bool = False
    """Whether torch can use this GPU (a CPU-only torch sees a GPU through NVML only)."""


@dataclass
class CpuProbe:
    """Host readings; None = could not be read."""

    name: str | None = None
    num_cores: int | None = None
    """Physical cores."""
    num_threads: int | None = None
    """Logical CPUs."""
    total_ram_bytes: int | None = None
    available_ram_bytes: int | None = None


@dataclass
class Probe:
    """What this machine has: a GPU (or None), the host CPU, the matched class profile."""

    cpu: CpuProbe
    gpu: GpuProbe | None = None
    profile: GpuProfile | None = None
    """Matched class profile; the cpu profile when there is no usable GPU; None = unknown GPU."""
    problems: list[str] = field(default_factory=list)
    """Why readings are missing (one line each), for the report."""

    @property
    def device(self) -> str:
        """Where the engine will run: "cuda" when torch can use the GPU, else "cpu"."""
        return "cuda" if self.gpu is not None and self.gpu.torch_cuda else "cpu"


def _read(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None when it raises (a reading torch or psutil cannot give here)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _probe_nvml(gpu: GpuProbe, uuid: str | None, problems: list[str]) -> None:
    """Fill what NVML knows; a missing or failing NVML leaves the fields as they are."""
    try:
        lib = nvml.load()
    except Exception as exc:  # no library, no driver, no permission: the probe goes on
        if gpu.torch_cuda:  # on a machine without a GPU, no NVML is no news
            problems.append(f"NVML unavailable ({type(exc).__name__}: {exc})")
        return
    try:
        handle = nvml.handle(lib, 0, uuid)
        if handle is None:
            if gpu.torch_cuda:
                problems.append("NVML could not find the GPU torch uses")
            return
        gpu.name = gpu.name or nvml.text(nvml.read(lib.nvmlDeviceGetName, handle))
        mem = nvml.read(lib.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            gpu.total_bytes, gpu.free_bytes = int(mem.total), int(mem.free)
        clock_mhz = nvml.read(lib.nvmlDeviceGetMaxClockInfo, handle, lib.NVML_CLOCK_MEM)
        bus_bits = nvml.read(lib.nvmlDeviceGetMemoryBusWidth, handle)
        if clock_mhz and bus_bits:
            gpu.bandwidth_gbs = clock_mhz * 1e6 * 2 * bus_bits / 8 / 1e9
        if gpu.compute_capability is None:
            cc = nvml.read(lib.nvmlDeviceGetCudaComputeCapability, handle)
            gpu.compute_capability = tuple(cc) if cc else None
        gpu.driver_version = nvml.text(nvml.read(lib.nvmlSystemGetDriverVersion))
    finally:
        nvml.read(lib.nvmlShutdown)


def _probe_torch(problems: list[str]) -> tuple[GpuProbe | None, str | None]:
    """(readings of cuda:0, its UUID) through torch, or (None, None) without a usable GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None, None
        props = torch.cuda.get_device_properties(0)
    except Exception as exc:
        problems.append(f"torch cannot read the GPU ({type(exc).__name__}: {exc})")
        return None, None
    gpu = GpuProbe(torch_cuda=True)
    gpu.name = getattr(props, "name", None)
    gpu.total_bytes = getattr(props, "total_memory", None)
    major, minor = getattr(props, "major", None), getattr(props, "minor", None)
    gpu.compute_capability = (major, minor) if major is not None else None
    gpu.num_sms = getattr(props, "multi_processor_count", None)
    gpu.bf16_supported = _read(torch.cuda.is_bf16_supported)
    uuid = getattr(props, "uuid", None)
    return gpu, (str(uuid) if uuid is not None else None)


def probe_cpu() -> CpuProbe:
    cpu = CpuProbe(name=platform.processor() or platform.machine() or None)
    try:
        import psutil
    except Exception:
        cpu.num_threads = os.cpu_count()
        return cpu
    cpu.num_cores = _read(psutil.cpu_count, False)
    cpu.num_threads = _read(psutil.cpu_count, True)
    mem = _read(psutil.virtual_memory)
    if mem is not None:
        cpu.total_ram_bytes, cpu.available_ram_bytes = int(mem.total), int(mem.available)
    return cpu


def probe(profiles: dict[str, GpuProfile] | None = None) -> Probe:
    """Probe this machine. Never raises for a missing GPU, driver or library."""
    profiles = load_gpu_profiles() if profiles is None else profiles
    problems: list[str] = []
    result = Probe(cpu=probe_cpu(), problems=problems)
    gpu, uuid = _probe_torch(problems)
    nvml_gpu = gpu or GpuProbe()
    _probe_nvml(nvml_gpu, uuid, problems)
    if gpu is None and nvml_gpu.name is not None:
        problems.append(f"{nvml_gpu.name} is visible to NVML but torch has no CUDA: a CPU plan")
    result.gpu = gpu or (nvml_gpu if nvml_gpu.name is not None else None)
    if result.device == "cuda":
        result.profile = match_gpu_profile(result.gpu.name, result.gpu.total_bytes, profiles)
        if result.profile is None:
            problems.append(f"no class profile for {result.gpu.name!r}: using the probe alone")
    else:
        result.profile = profiles.get("cpu")
    return result
