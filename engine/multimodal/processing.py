"""ImageProcessor: a chat with images into the prompt's token ids and one ImageInput per image,
through the model's own transformers processor (AutoProcessor of the model folder).

The chat template writes each {"type": "image"} content part as the model's image marker; the
processor runs its image processor on the images and expands each marker into that image's
run of placeholder tokens (the model's image token id, config.json image_token_id or
image_token_index). render() cuts the processor's tensors along those runs:

  Gemma 3   pixel_values [num_crops, 3, H, W]: one row per run (an image, or one of its
            pan-and-scan crops, in prompt order)
  Gemma 4   pixel_values [num_images, max_patches, patch_pixels] and image_position_ids
            [num_images, max_patches, 2]: one row per run
  Qwen-VL   pixel_values [sum of t*h*w, patch_pixels]: image i's rows are the product of
            image_grid_thw[i], in order; image_grid_thw [num_images, 3]: row i

Where AutoProcessor cannot build the processor (Qwen-VL's and Gemma 4's need torchvision for
their video processors), the image processor and tokenizer are loaded alone and the markers
are expanded here, as those processors expand them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from engine.multimodal import ImageInput, image_token_id
from engine.text.tokenizer import render_chat_template

logger = logging.getLogger("engine.multimodal")

TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})
"""Processor outputs that describe the text, not an image."""
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
"""Where a model folder keeps its image processor's settings."""
COUNT_KEYS = frozenset({"num_crops", "num_soft_tokens_per_image", "num_patches"})
"""Processor outputs that only size the placeholder runs."""


def model_takes_images(folder: str | Path | None) -> bool:
    """Whether the model in `folder` reads images: its config.json has a vision_config and an
    image token id."""
    if folder is None or not Path(folder).is_dir():
        return False
    config = _read_json(Path(folder) / "config.json")
    return "vision_config" in config and image_token_id(config) is not None


class ImageProcessor:
    """The model's processor, and how its output is cut into ImageInputs."""

    def __init__(self, processor: Any, tokenizer: Any, images: Any, token_id: int) -> None:
        """processor: the transformers processor, or None where only the image processor
        `images` and `tokenizer` could be built (markers are then expanded here). token_id:
        the image placeholder's id."""
        self.processor = processor
        self.tokenizer = tokenizer
        self.images = images
        self.token_id = token_id

    @classmethod
    def load(cls, folder: str | Path) -> ImageProcessor | None:
        """The processor of the model in `folder`; None for a model that takes text only.

        Raises:
            ValueError: the model reads images but its folder has no image processor
                (preprocessor_config.json or processor_config.json), or it cannot be loaded.
        """
        if not model_takes_images(folder):
            return None
        if not any((Path(folder) / name).exists() for name in PROCESSOR_FILES):
            raise ValueError(
                f"the model in {folder} reads images but the folder has no image processor "
                f"({' or '.join(PROCESSOR_FILES)}); copy it from the model's repository"
            )
        from transformers import AutoImageProcessor, AutoProcessor

        from engine.text.tokenizer import load_tokenizer

        token_id = image_token_id(_read_json(Path(folder) / "config.json"))
        try:
            processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
            if getattr(processor, "image_processor", None) is not None:
                template = getattr(processor, "chat_template", None)
                if template:  # the processor's template is the multimodal one
                    processor.tokenizer.chat_template = template
                return cls(processor, processor.tokenizer, processor.image_processor, token_id)
            reason = f"AutoProcessor gave a {type(processor).__name__}"
        except Exception as exc:  # noqa: BLE001 - any failure: try the parts alone below
            reason = f"{type(exc).__name__}: {exc}"
        logger.info("the processor of %s did not load (%s); expanding images here", folder, reason)
        try:
            images = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
            tokenizer = load_tokenizer(folder)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"cannot load the image processor of {folder}: {exc}") from exc
        return cls(None, tokenizer, images, token_id)

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
        images: list | None = None,
    ) -> tuple[list[int], list[ImageInput]]:
        """The prompt's token ids (each image's marker expanded into its placeholder run) and
        one ImageInput per run, in prompt order. `messages` hold content lists with one
        {"type": "image"} part per image of `images` (PIL images, in the same order).

        Raises:
            ValueError: the template or the processor refuses the conversation (the markers
                and the images do not pair up), with the reason.
        """
        images = list(images or [])
        text = render_chat_template(self.tokenizer, messages, tools, template_kwargs)
        if not images:
            return list(self.tokenizer.encode(text, add_special_tokens=False)), []
        out = self._process(text, images)
        ids = [int(t) for t in out["input_ids"][0]]
        runs = placeholder_runs(ids, self.token_id)
        return ids, [
            ImageInput(offset, length, data)
            for (offset, length), data in zip(runs, split_images(out, len(runs)), strict=True)
        ]

    def _image_settings(self) -> dict:
        """The image processor's own settings of the keys the processor's call would otherwise
        set to its class defaults (Gemma 3's pan-and-scan: off in Gemma3Processor's defaults,
        on where the model's preprocessor config says so)."""
        defaults = getattr(type(self.processor), "images_kwargs", None) or {}
        return {
            key: getattr(self.images, key)
            for key in defaults
            if getattr(self.images, key, None) is not None
        }

    def _process(self, text: str, images: list) -> dict[str, torch.Tensor]:
        """The processor's output for one prompt: input_ids [1, num_tokens] and the images'
        tensors."""
        if self.processor is not None:
            return self.processor(
                text=[text], images=images, return_tensors="pt", add_special_tokens=False,
                **self._image_settings(),
            )  # fmt: skip
        out = dict(self.images(images, return_tensors="pt"))
        marker = getattr(
            self.tokenizer, "image_token", None
        ) or self.tokenizer.convert_ids_to_tokens(self.token_id)
        pieces = text.split(marker)
        if len(pieces) - 1 != len(images):
            raise ValueError(
                f"the prompt has {len(pieces) - 1} image markers ({marker}) for {len(images)} "
                "images"
            )
        expanded = pieces[0]
        for i, piece in enumerate(pieces[1:]):
            expanded += self._expansion(out, i, marker) + piece
        out["input_ids"] = torch.tensor([self.tokenizer.encode(expanded, add_special_tokens=False)])
        return out

    def _expansion(self, out: dict, i: int, marker: str) -> str:
        """What image i's marker becomes, as the family's processor writes it."""
        if "image_grid_thw" in out:  # Qwen-VL: a pad token per merged patch
            merge = getattr(self.images, "merge_size", 2)
            return marker * (int(out["image_grid_thw"][i].prod()) // merge**2)
        if "num_soft_tokens_per_image" in out:  # Gemma 4: the soft tokens between boi and eoi
            n = int(out["num_soft_tokens_per_image"][i])
            return f"{self.tokenizer.boi_token}{marker * n}{self.tokenizer.eoi_token}"
        raise ValueError(
            f"cannot expand the image markers of a {type(self.images).__name__} without its "
            "processor; install the packages its processor needs (torchvision)"
        )


def placeholder_runs(ids: list[int], token_id: int) -> list[tuple[int, int]]:
    """(offset, length) of each maximal run of `token_id` in `ids`, in order."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate([*ids, None]):
        if t == token_id and start is None:
            start = i
        elif t != token_id and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def split_images(out: dict, num_runs: int) -> list[dict[str, torch.Tensor]]:
    """The processor's image tensors cut into one dict per placeholder run (see the module
    docstring for each family's layout)."""
    tensors = {
        k: v
        for k, v in out.items()
        if isinstance(v, torch.Tensor) and k not in TEXT_KEYS and k not in COUNT_KEYS
    }
    if "image_grid_thw" in tensors:
        grid = tensors.pop("image_grid_thw")  # [num_images, 3]
        if len(grid) != num_runs:
            raise ValueError(f"{len(grid)} images but {num_runs} placeholder runs in the prompt")
        rows = [int(g.prod()) for g in grid]
        starts = [sum(rows[:i]) for i in range(len(rows))]
        return [
            {"image_grid_thw": grid[i : i + 1]}
            | {k: v[s : s + n] for k, v in tensors.items()}  # [t*h*w, patch_pixels]
            for i, (s, n) in enumerate(zip(starts, rows, strict=True))
        ]
    for name, value in tensors.items():
        if value.shape[0] != num_runs:
            raise ValueError(
                f"the processor's {name} has {value.shape[0]} rows for {num_runs} placeholder "
                "runs in the prompt"
            )
    return [{k: v[i : i + 1] for k, v in tensors.items()} for i in range(num_runs)]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
