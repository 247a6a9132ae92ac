"""The architectures the engine runs: config.json's `architectures` name -> the model class
that runs it. The one list of supported names (errors and docs read it from here).

Torch-free: the planner reads configs without importing torch; a model class is imported
only when a model is built (`model_class`)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    name: str
    """config.json's `architectures` entry."""
    model_class: str
    """"module:Class" of our implementation."""
    hidden_acts: tuple[str, ...] = ("silu",)
    """The MLP activations this family's implementation computes."""


_GEMMA3 = "engine.models.gemma3:Gemma3ForCausalLM"
GEMMA3_NAMES = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
"""Gemma 3's architectures: the text model; a multimodal checkpoint runs its text part."""
_GEMMA4 = "engine.models.gemma4:Gemma4ForCausalLM"
GEMMA4_NAMES = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
"""Gemma 4's, likewise."""

QWEN3_5_NAMES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
"""Qwen3.5's architectures: the text model; a multimodal checkpoint runs its text part."""
QWEN3_5_MOE_NAMES = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
"""Qwen3.5-MoE's (Qwen3.5-35B-A3B's): the text model, or a multimodal checkpoint's text part."""

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("LlamaForCausalLM", "engine.models.llama:LlamaForCausalLM"),
        Architecture("MistralForCausalLM", "engine.models.llama:LlamaForCausalLM"),
        Architecture("Qwen2ForCausalLM", "engine.models.llama:LlamaForCausalLM"),
        Architecture("Qwen3ForCausalLM", "engine.models.llama:LlamaForCausalLM"),
        # a Qwen3 saved without its LM head (an embedding model): the tied embeddings stand in
        Architecture("Qwen3Model", "engine.models.llama:LlamaForCausalLM"),
        *(Architecture(name, _GEMMA3, ("gelu_pytorch_tanh",)) for name in GEMMA3_NAMES),
        *(Architecture(name, _GEMMA4, ("gelu_pytorch_tanh",)) for name in GEMMA4_NAMES),
        Architecture("Qwen3MoeForCausalLM", "engine.models.qwen3_moe:Qwen3MoeForCausalLM"),
        Architecture("BertModel", "engine.models.bert:BertModel", ("gelu",)),
        Architecture("BertForSequenceClassification", "engine.models.bert:BertModel", ("gelu",)),
        Architecture("GptOssForCausalLM", "engine.models.gpt_oss:GptOssForCausalLM"),
        *(Architecture(n, "engine.models.qwen3_5:Qwen3_5ForCausalLM") for n in QWEN3_5_NAMES),
        *(
            Architecture(n, "engine.models.qwen3_5_moe:Qwen3_5MoeForCausalLM")
            for n in QWEN3_5_MOE_NAMES
        ),
    )
}


def supported_names() -> str:
    return ", ".join(ARCHITECTURES)


def model_class(name: str) -> type:
    """The model class for an architecture name from ARCHITECTURES."""
    module, _, cls = ARCHITECTURES[name].model_class.partition(":")
    return getattr(importlib.import_module(module), cls)
