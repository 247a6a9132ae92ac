"""The memory a registry model will hold, known before it loads: its plan, made by the same
planner its engine core will run (on the CPU: host RAM), else its weight files' size.

On a GPU the front end reads no device (it never touches CUDA): the weight files stand in
until the model's first load reports its plan, and a load the planner refuses for want of
memory makes the registry unload another model and try again."""

from __future__ import annotations

import logging
from pathlib import Path

from appliance.settings import ServeSettings

logger = logging.getLogger("appliance.server")
PLAN_PARTS = (
    "weight_bytes",
    "kv_pool_bytes",
    "state_pool_bytes",
    "activation_bytes",
    "graph_pool_bytes",
    "draft_weight_bytes",
    "vision_weight_bytes",
    "vision_activation_bytes",
)
"""The parts of a plan that a loaded model holds (the planner's Plan fields)."""
WEIGHT_FILES = ("*.safetensors", "*.gguf", "*.bin")


def planned_bytes(plan: dict | None) -> int | None:
    """The memory a plan holds: weights, KV pool, state pool, activations, graphs and a draft
    model (None without a plan)."""
    if not plan:
        return None
    return sum(int(plan.get(part) or 0) for part in PLAN_PARTS)


def weight_file_bytes(path: str | None) -> int:
    """The size of a model's weight files (a .gguf file's own size)."""
    p = Path(path or "")
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(f.stat().st_size for pattern in WEIGHT_FILES for f in p.glob(pattern))
    return 0


def expected_bytes(settings: ServeSettings) -> int:
    """What the model of `settings` will hold once loaded: its CPU plan (device "cpu"), else
    its weight files' size. Blocking (reads the model's config; a .gguf file's first use
    converts it): call it from a worker thread."""
    if settings.device == "cpu":
        try:
            return _cpu_plan_bytes(settings)
        except Exception as exc:  # noqa: BLE001 - the load reports the real failure
            logger.debug("cannot plan %s ahead: %s", settings.model, exc)
    return weight_file_bytes(settings.model)


def load_problem(settings: ServeSettings) -> str | None:
    """Why the model of `settings` cannot load at all, read from its config alone (no config.json,
    an architecture the engine does not run), or None: the registry refuses such a model
    before it unloads another to make room for it. A .gguf file is not converted here (None)."""
    from appliance.model_presets import resolve_served_model
    from engine.models.loader import needs_conversion, resolve_model_folder
    from engine.models.model_config import ModelConfig

    try:
        model = resolve_served_model(settings.model, settings.load_format)
        if needs_conversion(model):
            return None
        ModelConfig.from_folder(str(resolve_model_folder(model)))
    except (ValueError, OSError) as exc:
        return str(exc)
    return None


def _cpu_plan_bytes(settings: ServeSettings) -> int:
    from appliance.model_presets import resolve_served_model
    from engine.config import EngineConfig
    from engine.models.loader import resolve_model_folder
    from engine.models.model_config import ModelConfig
    from engine.planner import read_device
    from engine.startup.planned_config import plan_engine

    folder = resolve_model_folder(resolve_served_model(settings.model, settings.load_format))
    model = ModelConfig.from_folder(str(folder))
    pins = EngineConfig.from_kwargs(**settings.engine_kwargs())
    plan, _ = plan_engine(pins, model, "cpu", read_device("cpu"))
    return planned_bytes(plan.to_dict()) or 0
