"""`appliance serve`'s memory plan: probe the device, run the planner with the settings the user
pinned (flags, APPLIANCE_* variables, config file, tuned profile), and build the engine from the
planned values with the plan's memory prediction, which the engine checks after warm-up.

Planning needs only the model's config.json, so a pinned value that cannot fit is refused in a
second or two, before the server listens or loads a single weight.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from appliance.plan_model import Device, Plan, PlanRequest
from appliance.planner import plan
from appliance.probe import Probe, device_from_probe, load_gpu_profiles, probe
from appliance.settings import ServeSettings

logger = logging.getLogger("appliance.plan")
PLAN_PINS = ("gpu_memory_utilization", "quantization", "kv_cache_dtype", "max_model_len",
             "max_num_seqs", "max_num_batched_tokens", "num_kv_blocks")  # fmt: skip


def probe_for(device: str) -> tuple[Probe, Device, list[str]]:
    """The probe, the planner's device and notes; device "cpu" plans for the CPU even when a
    GPU is visible. Raises ValueError when the memory size cannot be read."""
    found = probe()
    notes = list(found.problems)
    if device == "cpu" and found.device == "cuda":
        found.gpu, found.profile = None, load_gpu_profiles().get("cpu")
        notes.append("--device cpu: planning for the CPU")
    return found, device_from_probe(found), notes


def plan_request(settings: ServeSettings) -> PlanRequest:
    """The planner's targets (defaults) and the user's pins."""
    pins = {name: getattr(settings, name) for name in PLAN_PINS}
    return PlanRequest(
        dtype=None if settings.dtype == "auto" else settings.dtype,
        block_size=settings.block_size or 16,
        enforce_eager=bool(settings.enforce_eager),
        quantize_embeddings=bool(settings.quantize_embeddings),
        **pins,
    )


def plan_for_serve(settings: ServeSettings) -> Plan:
    """Plan for the settings' model on this machine; raises PlanError (a ValueError naming the
    one setting to change and its value) when the pins cannot fit."""
    from appliance.profile_cmd import load_model_config

    _, model = load_model_config(settings.model)
    _, device, notes = probe_for(settings.device)
    result = plan(model, device, plan_request(settings))
    for note in notes:
        logger.info("plan note: %s", note)
    for key, value in result.engine_kwargs().items():
        logger.info("plan: %s = %s (%s)", key, value, result.reasons.get(key, ""))
    return result


def planned_loader(settings: ServeSettings) -> Callable[[], Any]:
    """Plan now (fail fast); the returned loader builds the engine from the plan and attaches
    it, with the post-warm-up memory check, as `engine.plan` for /v1/stats."""
    from appliance.model_presets import resolve_served_model

    model = resolve_served_model(settings.model, settings.load_format)
    settings = dataclasses.replace(settings, model=model)
    result = plan_for_serve(settings)

    def load() -> Any:
        from engine.llm_engine import LLMEngine
        from engine.memory_check import MemoryItems

        kwargs = {**settings.engine_kwargs(), **result.engine_kwargs()}
        predicted = MemoryItems.from_plan(result) if result.device == "cuda" else None
        engine = LLMEngine(
            settings.model, device=settings.device, predicted_memory=predicted, **kwargs
        )
        check = engine.memory.to_dict() if engine.memory is not None else None
        engine.plan = {**result.to_dict(), "memory_check": check}
        return engine

    return load
