"""Inference engine: paged KV cache, continuous batching, speculative decoding and structured
outputs, over its own implementations of the models it runs (engine/models/architectures.py: the
Llama family, Gemma 3 and 4, Qwen3-MoE, gpt-oss, Qwen3.5 and Qwen3.5-MoE).

Offline use: `from engine import LLM, SamplingParams`. The names load on first use, so light
submodules (engine.models.model_config, engine.sampling_params) import without torch's start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]

_WHERE = {
    "LLM": "engine.llm",
    "EngineConfig": "engine.config",
    "RequestOutput": "engine.scheduling.request",
    "SamplingParams": "engine.sampling_params",
}

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams
    from engine.scheduling.request import RequestOutput


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
