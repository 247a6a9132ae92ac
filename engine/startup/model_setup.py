"""What an engine settles before its weights load: the model folder (a GGUF file converted
once), its ModelConfig and draft model, the plan turned into a complete EngineConfig, and the
tokenizer with its end-of-sequence ids. Each part is a start-up phase of its own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.models.loader import needs_conversion, resolve_model_folder
from engine.models.model_config import ModelConfig
from engine.planner import Device, Plan
from engine.spec.draft_model import draft_model_config
from engine.startup.phases import StartupTimer
from engine.startup.planned_config import plan_engine, prefix_caching_for, resolve_device
from engine.text.tokenizer import eos_token_ids, load_tokenizer

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The name of the embedded model, served when none is named."""


@dataclass
class ModelSetup:
    """The settled model, device and settings an LLMEngine is built from."""

    device: torch.device
    folder: Path
    """The Hugging Face folder the weights load from (a GGUF file's cached conversion)."""
    model_name: str
    model_config: ModelConfig
    draft: tuple[Path, ModelConfig] | None
    """The draft model's folder and config (speculative="draft:PATH"), else None."""
    plan: Plan
    config: EngineConfig
    """Every setting: the caller's pins, the rest planned."""
    tokenizer: object | None
    """None for a random-weight benchmark folder without tokenizer files (token ids only)."""
    eos_token_ids: frozenset[int]


def set_up_model(
    model: str | Path | None,
    device: str,
    device_info: Device | None,
    config: dict,
    timer: StartupTimer,
    plan_targets: dict | None = None,
) -> ModelSetup:
    """Resolve the model, plan every setting the caller did not pin (`config`: EngineConfig
    settings by name; `plan_targets`: PlanRequest fields beyond them) for this device, and
    load the tokenizer, timing each phase."""
    if needs_conversion(model):
        with timer.phase("convert"):
            resolve_model_folder(model)  # once: the call below finds it in the cache
    with timer.phase("config"):
        pins = EngineConfig.from_kwargs(**config)
        torch_device = resolve_device(device)
        folder = resolve_model_folder(model)
        model_config = ModelConfig.from_folder(folder)
        draft = draft_model_config(pins, model_config)  # read once, here
    with timer.phase("plan"):
        plan, settings = plan_engine(
            pins,
            model_config,
            torch_device.type,
            device_info,
            draft_model=None if draft is None else draft[1],
            **(plan_targets or {}),
        )
        settings = prefix_caching_for(model_config, settings)
    with timer.phase("tokenizer"):
        tokenizer = None
        if settings.load_format != "random" or (folder / "tokenizer_config.json").exists():
            tokenizer = load_tokenizer(folder)
        eos = eos_token_ids(folder, tokenizer) if tokenizer is not None else frozenset()
    return ModelSetup(
        device=torch_device,
        folder=folder,
        model_name=Path(model).stem if model is not None else DEFAULT_MODEL_NAME,
        model_config=model_config,
        draft=draft,
        plan=plan,
        config=settings,
        tokenizer=tokenizer,
        eos_token_ids=eos,
    )
