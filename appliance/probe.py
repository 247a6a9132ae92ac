"""The hardware probe: what GPU (or CPU) is here, read through pynvml, torch and psutil.

Every reading is optional: a value the hardware, the driver or a missing library cannot give
is None (shown as n/a), never an exception. No visible CUDA GPU gives a CPU probe. The probed
device is matched to a GPU class profile (profiles/gpus/*.toml) for the figures a probe cannot
read (bf16 TFLOP/s, default utilization, CUDA context size); unknown GPUs still work from the
probe alone.
"""

from __future__ import annotations

import os
import platform
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.memory_cap import CAP_ENV, memory_cap_bytes

if TYPE_CHECKING:
    from appliance.plan_model import Device

GIB = 1024**3
PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles" / "gpus"


@dataclass
class GpuProfile:
    """One GPU class (or the CPU) from profiles/gpus/NAME.toml; public spec values."""

    key: str
    """File stem, e.g. "rtx-4090"."""
    name: str
    kind: str
    """"cuda" or "cpu"."""
    match: list[str]
    """Regular expressions (case-insensitive) searched in the probed device name."""
    memory_gib: float
    """Nominal device memory; 0 = take it from the probe (the CPU)."""
    bandwidth_gbs: float
    """Memory bandwidth, GB/s."""
    bf16_tflops: float
    """Dense bf16 tensor-core rate, TFLOP/s (0 where there is no bf16)."""
    fp16_tflops: float
    bf16_supported: bool
    default_utilization: float
    """Share of device memory the appliance plans to use."""
    cuda_context_gib: float
    """Memory the CUDA context and kernels' modules take before any tensor."""
    max_num_seqs: int
    """Upper bound for the planned max_num_seqs on this class."""
    max_num_batched_tokens: int
    """Planned prefill chunk (token budget of one step) on this class."""
    notes: str = ""
    max_kv_gib: float = 0
    """Largest KV pool to plan, GiB; 0 = no cap beyond memory (see profiles/gpus/cpu.toml)."""

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "cpu"):
            raise ValueError(f"GPU profile {self.key}: kind must be cuda or cpu, got {self.kind}")
        if not 0.0 < self.default_utilization <= 1.0:
            raise ValueError(f"GPU profile {self.key}: default_utilization must be in (0, 1]")
        for name in ("memory_gib", "bandwidth_gbs", "bf16_tflops", "cuda_context_gib"):
            if getattr(self, name) < 0:
                raise ValueError(f"GPU profile {self.key}: {name} must be >= 0")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ValueError(f"GPU profile {self.key}: max_num_* must be positive")

    def matches(self, device_name: str) -> bool:
        return any(re.search(p, device_name, re.IGNORECASE) for p in self.match)


def load_gpu_profiles(folder: Path = PROFILES_DIR) -> dict[str, GpuProfile]:
    """Every profile in the folder, by file stem."""
    profiles = {}
    for path in sorted(folder.glob("*.toml")):
        with path.open("rb") as f:
            raw = tomllib.load(f)
        profiles[path.stem] = GpuProfile(key=path.stem, **raw)
    return profiles


def match_gpu_profile(
    name: str | None, total_bytes: int | None, profiles: dict[str, GpuProfile]
) -> GpuProfile | None:
    """The class profile whose pattern matches the name; of several, the nearest in memory.

    A match whose nominal memory is more than 25% away from the probed total is refused (an
    8 GB card of a name we know only as 16 GB is not that class)."""
    if not name:
        return None
    found = [p for p in profiles.values() if p.kind == "cuda" and p.matches(name)]
    if total_bytes is None:
        return found[0] if found else None
    total_gib = total_bytes / GIB
    found = [p for p in found if abs(p.memory_gib - total_gib) <= 0.25 * p.memory_gib]
    return min(found, key=lambda p: abs(p.memory_gib - total_gib), default=None)


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
    """fn(*args), or None when it raises (a reading the hardware or driver does not give)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _probe_nvml(gpu: GpuProbe, uuid: str | None, problems: list[str]) -> None:
    """Fill what NVML knows; a missing or failing NVML leaves the fields as they are."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no permission: the probe goes on
        problems.append(f"NVML unavailable ({type(exc).__name__}: {exc})")
        return
    try:
        handle = _read(pynvml.nvmlDeviceGetHandleByUUID, f"GPU-{uuid}") if uuid else None
        if handle is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
            handle = _read(pynvml.nvmlDeviceGetHandleByIndex, 0)
        if handle is None:
            problems.append("NVML could not find the GPU torch uses")
            return
        gpu.name = gpu.name or _text(_read(pynvml.nvmlDeviceGetName, handle))
        mem = _read(pynvml.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            gpu.total_bytes, gpu.free_bytes = int(mem.total), int(mem.free)
        clock_mhz = _read(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM)
        bus_bits = _read(pynvml.nvmlDeviceGetMemoryBusWidth, handle)
        if clock_mhz and bus_bits:
            gpu.bandwidth_gbs = clock_mhz * 1e6 * 2 * bus_bits / 8 / 1e9
        if gpu.compute_capability is None:
            cc = _read(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
            gpu.compute_capability = tuple(cc) if cc else None
        gpu.driver_version = _text(_read(pynvml.nvmlSystemGetDriverVersion))
    finally:
        _read(pynvml.nvmlShutdown)


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


def device_from_probe(result: Probe) -> Device:
    """The planner's view of the probed device; class-profile figures fill what the probe lacks.

    Raises ValueError when not even the memory size can be read or looked up."""
    from appliance.plan_model import Device

    prof, gpu = result.profile, result.gpu
    if result.device == "cpu":
        ram = result.cpu.available_ram_bytes or result.cpu.total_ram_bytes
        if ram is None:
            raise ValueError("cannot read the RAM size (psutil failed); pin num_kv_blocks")
        return Device(
            kind="cpu", name=result.cpu.name or "CPU", total_bytes=ram, bf16_supported=False,
            utilization=prof.default_utilization if prof else 0.5, cuda_context_bytes=0,
            max_num_seqs=prof.max_num_seqs if prof else 16,
            max_num_batched_tokens=prof.max_num_batched_tokens if prof else 2048,
            bandwidth_gbs=prof.bandwidth_gbs if prof else None, bf16_tflops=None,
            max_kv_bytes=int(prof.max_kv_gib * GIB) if prof and prof.max_kv_gib else None,
        )  # fmt: skip
    total = gpu.total_bytes or (int(prof.memory_gib * GIB) if prof and prof.memory_gib else None)
    if total is None:
        raise ValueError(f"cannot read the memory size of {gpu.name or 'the GPU'}")
    cc = gpu.compute_capability
    bf16 = gpu.bf16_supported
    if bf16 is None:
        bf16 = prof.bf16_supported if prof else (cc is not None and cc >= (8, 0))
    used = total - gpu.free_bytes if gpu.free_bytes is not None else 0
    context = int((prof.cuda_context_gib if prof else 0.5) * GIB)
    used -= _own_cuda_bytes(context)  # "others" are other processes, not this one
    cap = memory_cap_bytes()  # APPLIANCE_MEMORY_CAP_GIB: plan as if the card were that size
    if cap is not None and cap < total:
        result.problems.append(f"{CAP_ENV}: planning for {cap / GIB:.1f} of {total / GIB:.1f} GiB")
        total = cap
    return Device(
        kind="cuda", name=gpu.name or "GPU", total_bytes=total, used_bytes=max(0, used),
        bf16_supported=bf16, utilization=prof.default_utilization if prof else 0.90,
        cuda_context_bytes=context,
        max_num_seqs=prof.max_num_seqs if prof else 256,
        max_num_batched_tokens=prof.max_num_batched_tokens if prof else 2048,
        bandwidth_gbs=gpu.bandwidth_gbs or (prof.bandwidth_gbs if prof else None),
        bf16_tflops=(prof.bf16_tflops or None) if prof else None,
    )  # fmt: skip


def _own_cuda_bytes(context: int) -> int:
    """What this process already holds on cuda:0 (its context and allocator cache), which the
    plan counts itself; 0 before torch has touched CUDA."""
    try:
        import torch

        if not torch.cuda.is_initialized():
            return 0
        return context + torch.cuda.memory_reserved(0)
    except Exception:
        return 0
