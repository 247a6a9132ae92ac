"""`appliance serve`'s engine: resolve the model (a preset name becomes its prepared folder),
plan it now with the settings the user pinned (flags, APPLIANCE_* variables, config file, tuned
profile), and hand the server a loader that builds the engine, which plans the same way.

Planning needs only the model's config.json, so a pinned value that cannot fit is refused in a
second or two, before the server listens or loads a single weight.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from appliance.settings import ServeSettings
from engine.planner import Plan

logger = logging.getLogger("appliance.plan")


def plan_for_serve(settings: ServeSettings) -> Plan:
    """The plan the engine will run for these settings on this machine; raises PlanError (a
    ValueError naming the one setting to change and its value) when the pins cannot fit."""
    from engine.config import EngineConfig
    from engine.models.config import ModelConfig
    from engine.models.loader import resolve_model_folder
    from engine.planner import read_device
    from engine.planning import plan_engine, resolve_device

    model = ModelConfig.from_folder(resolve_model_folder(settings.model))
    pins = EngineConfig.from_kwargs(**settings.engine_kwargs())
    kind = resolve_device(settings.device).type
    # Read through NVML: the engine runs in the core process, and a CUDA context here would
    # hold GPU memory for nothing and be counted against the engine's own plan.
    device_info = read_device(kind, nvml=True) if kind == "cuda" else None
    result, _ = plan_engine(pins, model, kind, device_info)
    for key, value in result.engine_kwargs().items():
        logger.info("plan: %s = %s (%s)", key, value, result.reasons.get(key, ""))
    return result


@dataclasses.dataclass(frozen=True)
class EngineLoader:
    """Builds the engine for `settings`; picklable, so the engine core process calls it."""

    settings: ServeSettings

    def __call__(self) -> Any:
        from engine.llm_engine import LLMEngine

        s = self.settings
        return LLMEngine(s.model, device=s.device, **s.engine_kwargs())


def planned_loader(settings: ServeSettings) -> Callable[[], Any]:
    """Plan now (fail fast); the returned loader builds the engine, which plans the same values
    and checks them against the measured peak after warm-up."""
    from appliance.model_presets import resolve_served_model

    model = resolve_served_model(settings.model, settings.load_format)
    settings = dataclasses.replace(settings, model=model)
    plan_for_serve(settings)
    return EngineLoader(settings)
