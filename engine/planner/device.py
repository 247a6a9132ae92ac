"""The device the planner plans for: its readings (what torch and psutil read here) and the GPU
class profile (profiles/gpus/NAME.toml) that fills in what a reading cannot give.

`read_device` is how every entry point gets its Device (LLM(), `appliance serve`, `appliance
profile`), so they plan the same thing on the same machine. Importing this module needs no
torch; read_device imports it when called.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from engine.memory.memory_cap import memory_cap_bytes
from engine.planner.formulas import GIB

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles" / "gpus"


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
class Device:
    """What the planner needs to know about the device; built by read_device or by hand."""

    kind: str
    """"cuda" or "cpu"."""
    name: str
    total_bytes: int
    """Device memory (on the CPU: the RAM available to us)."""
    used_bytes: int = 0
    """Memory other processes held when read."""
    bf16_supported: bool = True
    utilization: float = 0.90
    """Default share of total memory to plan with (the GPU class profile's)."""
    cuda_context_bytes: int = GIB // 2
    max_num_seqs: int = 256
    """Largest max_num_seqs to plan."""
    max_num_batched_tokens: int = 2048
    bandwidth_gbs: float | None = None
    bandwidth_source: str | None = None
    """Where bandwidth_gbs comes from: the GPU class profile's nominal figure, or a reading."""
    bf16_tflops: float | None = None
    max_kv_bytes: int | None = None
    """Largest KV pool to plan (the CPU's: see the planner); None = as much as fits."""
    profile: str | None = None
    """The matched GPU class profile's key; None = an unknown GPU, planned from its readings."""

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "cpu"):
            raise ValueError(f"device kind must be cuda or cpu, got {self.kind!r}")
        if self.total_bytes <= 0 or self.used_bytes < 0 or self.cuda_context_bytes < 0:
            raise ValueError("device memory figures must be positive")
        if not 0.0 < self.utilization <= 1.0:
            raise ValueError(f"utilization must be in (0, 1], got {self.utilization}")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ValueError("device max_num_seqs and max_num_batched_tokens must be positive")


@dataclass
class DeviceReadings:
    """What a probe read of one device; None = could not be read."""

    kind: str
    name: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    has_own_context: bool = False
    """This process's CUDA context exists and is counted in free_bytes (the plan counts it as
    the class profile's cuda_context_gib)."""
    bf16_supported: bool | None = None
    compute_capability: tuple[int, int] | None = None
    bandwidth_gbs: float | None = None


def device_for(readings: DeviceReadings, profiles: dict[str, GpuProfile] | None = None) -> Device:
    """The planner's Device: the readings, the class profile's figures where a reading is
    missing, and APPLIANCE_MEMORY_CAP_GIB as the total. Raises ValueError when not even the
    memory size can be read or looked up."""
    profiles = load_gpu_profiles() if profiles is None else profiles
    r = readings
    if r.kind == "cpu":
        prof = profiles.get("cpu")
        if r.total_bytes is None:
            raise ValueError("cannot read the RAM size (psutil failed); pin num_kv_blocks")
        return Device(
            kind="cpu",
            name=r.name or "CPU",
            total_bytes=r.total_bytes,
            bf16_supported=False,
            utilization=prof.default_utilization if prof else 0.5,
            cuda_context_bytes=0,
            max_num_seqs=prof.max_num_seqs if prof else 16,
            max_num_batched_tokens=prof.max_num_batched_tokens if prof else 2048,
            bandwidth_gbs=prof.bandwidth_gbs if prof else None,
            bandwidth_source=_nominal(prof),
            bf16_tflops=None,
            max_kv_bytes=int(prof.max_kv_gib * GIB) if prof and prof.max_kv_gib else None,
            profile=prof.key if prof else None,
        )
    prof = match_gpu_profile(r.name, r.total_bytes, profiles)
    total = r.total_bytes or (int(prof.memory_gib * GIB) if prof and prof.memory_gib else None)
    if total is None:
        raise ValueError(f"cannot read the memory size of {r.name or 'the GPU'}")
    bf16 = r.bf16_supported
    if bf16 is None:
        cc = r.compute_capability
        bf16 = prof.bf16_supported if prof else (cc is not None and cc >= (8, 0))
    context = int((prof.cuda_context_gib if prof else 0.5) * GIB)
    used = 0
    if r.free_bytes is not None:
        used = total - r.free_bytes - (context if r.has_own_context else 0)
    cap = memory_cap_bytes()  # APPLIANCE_MEMORY_CAP_GIB: plan as if the card were that size
    if cap is not None and cap < total:
        total = cap  # what others hold still counts in full
    return Device(
        kind="cuda",
        name=r.name or "GPU",
        total_bytes=total,
        used_bytes=max(0, used),
        bf16_supported=bf16,
        utilization=prof.default_utilization if prof else 0.90,
        cuda_context_bytes=context,
        max_num_seqs=prof.max_num_seqs if prof else 256,
        max_num_batched_tokens=prof.max_num_batched_tokens if prof else 2048,
        bandwidth_gbs=r.bandwidth_gbs or (prof.bandwidth_gbs if prof else None),
        bandwidth_source="probe reading" if r.bandwidth_gbs else _nominal(prof),
        bf16_tflops=(prof.bf16_tflops or None) if prof else None,
        profile=prof.key if prof else None,
    )


def _nominal(prof: GpuProfile | None) -> str | None:
    """How a profile's bandwidth figure is named: nominal, and the class it is the figure of."""
    return f"nominal ({prof.name}, profiles/gpus/{prof.key}.toml)" if prof else None


def read_device(kind: str, profiles: dict[str, GpuProfile] | None = None) -> Device:
    """The Device of this machine's cuda:0 ("cuda", read through torch: the process that reads
    it is the one that runs the engine) or of its CPU and RAM ("cpu")."""
    if kind != "cuda":
        return device_for(read_cpu(), profiles)
    return device_for(read_cuda(), profiles)


def read_cpu() -> DeviceReadings:
    import platform

    import psutil

    try:
        ram = int(psutil.virtual_memory().available)
    except Exception:  # psutil cannot read this machine's memory
        ram = None
    return DeviceReadings("cpu", platform.processor() or platform.machine() or None, ram)


def read_cuda() -> DeviceReadings:
    """cuda:0 through torch: name, memory (free and total, as CUDA reports them), bf16. What
    this process already holds (another engine, the caller's tensors) counts as used: the new
    engine cannot plan with it, and its memory check measures it."""
    import torch

    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)  # creates this process's context if needed
    return DeviceReadings(
        "cuda",
        props.name,
        total,
        free,
        has_own_context=True,
        bf16_supported=torch.cuda.is_bf16_supported(),
        compute_capability=(props.major, props.minor),
    )
