"""The vision encoders of the multimodal families (Gemma 3, Gemma 4, Qwen3.5): each turns a
list of ImageInput (engine/multimodal) into the rows that replace the images' placeholder
embeddings in the text model. Built from the checkpoint's config.json, loaded from its
vision-tower and projector weights, run on our Linear (quantizable) and attention paths."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Iterable

import torch
from torch import nn

ENCODERS = {
    "gemma3": "engine.models.vision.gemma3_vision:Gemma3Vision",
    "gemma4": "engine.models.vision.gemma4_vision:Gemma4Vision",
    "qwen3_5": "engine.models.vision.qwen3_5_vision:Qwen3_5Vision",
    "qwen3_5_moe": "engine.models.vision.qwen3_5_vision:Qwen3_5Vision",
}
"""config.json's model_type -> "module:Class" of the family's vision encoder."""


def build_vision(config: dict | None) -> nn.Module | None:
    """The vision encoder a multimodal checkpoint's config names (None for a text model)."""
    if not config:
        return None
    kind = config.get("model_type")
    if kind not in ENCODERS:
        raise ValueError(
            f"no vision encoder for model_type {kind!r}; images are served for: "
            + ", ".join(sorted(ENCODERS))
        )
    module, cls = ENCODERS[kind].split(":")
    return getattr(importlib.import_module(module), cls)(config)


Weights = Iterable[tuple[str, torch.Tensor]]


def load_with_vision(
    vision: nn.Module | None,
    weights: Weights,
    copy: Callable,
    load_text: Callable[[Weights, Collection[str]], None],
) -> None:
    """Load a multimodal checkpoint: the vision encoder's weights (its module's PREFIXES) go
    to `vision.load_weights` once the text model's are in; `load_text(text weights, our
    parameter names the vision encoder fills)` loads the rest. With no encoder every weight
    goes to load_text."""
    if vision is None:
        load_text(weights, ())
        return
    prefixes = tuple(importlib.import_module(type(vision).__module__).PREFIXES)
    held: list[tuple[str, torch.Tensor]] = []

    def text_weights() -> Weights:
        for name, tensor in weights:
            if name.startswith(prefixes):
                held.append((name, tensor))
            else:
                yield name, tensor

    load_text(text_weights(), {f"vision.{name}" for name, _ in vision.named_parameters()})
    vision.load_weights(held, copy)


MultimodalEmbeds = tuple[torch.Tensor, torch.Tensor]
"""(rows [k] int64, values [k, hidden]): the packed batch's rows that are image placeholders
and the encoder rows that replace their embeddings (engine/runner/vision_step.py)."""


def merge_images(x: torch.Tensor, images: MultimodalEmbeds | None) -> torch.Tensor:
    """x [num_tokens, hidden] with the image rows written over (in x's dtype)."""
    if images is None:
        return x
    rows, values = images
    return x.index_copy(0, rows, values.to(x.dtype))
