"""GpuReader: the GPU readings of /v1/stats (name, utilization, memory, power, temperature,
SM clock) through NVML, cached briefly so that every stats reader shares one reading."""

from __future__ import annotations

import logging
import time

from engine.planner import nvml

logger = logging.getLogger("appliance.server")
GPU_READ_INTERVAL_S = 0.5


class GpuReader:
    """GPU readings through NVML (engine.planner.nvml), cached for GPU_READ_INTERVAL_S.

    Every field is None when it cannot be read: no NVML, no GPU, a CPU engine, or a reading the
    board does not support. It never raises.
    """

    FIELDS = (
        "name",
        "utilization_perc",
        "memory_used_bytes",
        "memory_total_bytes",
        "power_w",
        "temperature_c",
        "sm_clock_mhz",
    )

    def __init__(self) -> None:
        self._nvml = None
        self._failed = False
        self._cache: tuple[float, dict] | None = None

    def read(self, device) -> dict:
        now = time.monotonic()
        if self._cache is not None and now - self._cache[0] < GPU_READ_INTERVAL_S:
            return self._cache[1]
        reading = dict.fromkeys(self.FIELDS)
        handle = self._handle(device)
        if handle is not None:
            reading.update(self._readings(handle))
        self._cache = (now, reading)
        return reading

    def _handle(self, device):
        kind, _, number = str(device).partition(":")  # "cuda:0" (a torch.device or its name)
        if device is None or kind != "cuda":
            return None
        lib = self._init()
        if lib is None:
            return None
        return nvml.handle(lib, int(number) if number.isdigit() else 0)

    def _init(self):
        if self._nvml is not None or self._failed:
            return self._nvml
        try:
            self._nvml = nvml.load()
        except Exception as exc:
            logger.info("GPU readings unavailable (NVML: %s)", exc)
            self._failed = True
        return self._nvml

    def _readings(self, handle) -> dict:
        lib = self._nvml
        getters = {
            "name": lambda: nvml.text(lib.nvmlDeviceGetName(handle)),
            "utilization_perc": lambda: float(lib.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory_used_bytes": lambda: int(lib.nvmlDeviceGetMemoryInfo(handle).used),
            "memory_total_bytes": lambda: int(lib.nvmlDeviceGetMemoryInfo(handle).total),
            "power_w": lambda: lib.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "temperature_c": lambda: float(
                lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)
            ),
            "sm_clock_mhz": lambda: float(lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM)),
        }
        out: dict = {}
        for key, get in getters.items():
            try:
                out[key] = get()
            except Exception:  # unsupported on this board, or the GPU went away
                out[key] = None
        return out
