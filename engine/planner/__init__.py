"""The memory planner: one torch-free plan for every entry point (LLM(), `appliance serve`,
`appliance profile`). From a model shape, a Device and the caller's pins to every engine setting
the caller did not pin, with a reason for each and the bytes behind them.

    from engine.planner import PlanRequest, plan, read_device
    p = plan(model_config, read_device("cuda"), PlanRequest(max_model_len=8192))
"""

from __future__ import annotations

from engine.planner.device import Device, DeviceReadings, device_for, read_device
from engine.planner.formulas import GIB, WEIGHT_FORMATS, size_text
from engine.planner.plan_request import (
    IMAGE_LIMITS,
    PINNABLE,
    PLANNED,
    Plan,
    PlanError,
    PlanRequest,
    plan_settings,
)
from engine.planner.refusal import plan

__all__ = [
    "GIB",
    "IMAGE_LIMITS",
    "PINNABLE",
    "PLANNED",
    "WEIGHT_FORMATS",
    "Device",
    "DeviceReadings",
    "Plan",
    "PlanError",
    "PlanRequest",
    "device_for",
    "size_text",
    "plan",
    "plan_settings",
    "read_device",
]
