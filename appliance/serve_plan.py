"""`appliance serve`'s engine: the loader the engine core process calls to build it, and the plan
that core reports, logged by the front end.

The engine plans once, in the core, for the device as that process reads it
(engine.startup.planned_config: the settings the user pinned through flags, APPLIANCE_* variables,
the config file or a tuned profile, every other one chosen). The core sends the plan back with what
else it reports at start-up (engine.core.info.EngineInfo); the front end logs that plan and serves
it in /v1/stats, so the log says what runs. Planning needs only the model's config.json: pins that
cannot fit are refused before any weight loads, and `appliance serve` exits 2.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.settings import ServeSettings
from engine.planner import IMAGE_LIMITS, plan_settings

logger = logging.getLogger("appliance.plan")


@dataclass(frozen=True)
class EngineLoader:
    """Builds the engine for `settings` in the engine core process (it is pickled across): a
    preset name becomes its prepared folder there too, since preparing one may convert the
    embedded model, and the server must answer /health meanwhile."""

    settings: ServeSettings

    def __call__(self, on_phase: Callable[[str], None] | None = None) -> Any:
        from appliance.model_presets import resolve_served_model
        from engine.llm_engine import LLMEngine

        s = self.settings
        model = resolve_served_model(s.model, s.load_format)
        limits = {name: getattr(s, name) for name in IMAGE_LIMITS}  # the encoder's share
        return LLMEngine(
            model, device=s.device, on_phase=on_phase, plan_targets=limits, **s.engine_kwargs()
        )


def log_plan(plan: dict | None) -> None:
    """One log line per planned setting, with its reason, from the plan the core reported
    (nothing for an engine without a plan, such as a test's stand-in)."""
    if plan is None:
        return
    for name, value, why in plan_settings(plan):
        logger.info("plan: %s = %s (%s)", name, value, why)
