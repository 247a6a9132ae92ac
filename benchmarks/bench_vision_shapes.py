"""The multimodal shapes benchmarks/bench_vision.py runs (whole config.json dicts: a text preset
of profiles/models wrapped with its vision tower's published values), the random images and
prompts it sends, and the FLOPs its floor counts.

Shapes, and where each value comes from:
- Gemma 3 12B (google/gemma-3-12b-it's config.json): text_config = profiles/models/gemma-3-12b;
  vision_config = SigLIP so400m at 896 px (hidden 1152, MLP 4304, 27 layers, 16 heads, patch
  14, image 896, vision_use_head false); mm_tokens_per_image 256, image_token_index 262144,
  boi_token_index 255999, eoi_token_index 256000; architectures
  ["Gemma3ForConditionalGeneration"], model_type gemma3.
- Qwen3.5-27B: text_config = profiles/models/qwen3.5-27b; vision_config = the Qwen3-VL-style
  tower of transformers' Qwen3_5VisionConfig, documented as Qwen/Qwen3.5-27B's (depth 27,
  hidden 1152, MLP 4304, 16 heads, patch 16, spatial merge 2, temporal patch 2, 2304 position
  embeddings, gelu_pytorch_tanh), out_hidden_size = the text hidden size (5120); the image,
  video and vision start/end ids are Qwen3_5Config's defaults (248056, 248057, 248053, 248054).

Encoder FLOPs of one image (encoder_flops): 2 x tower weights x patches (patch embedding and
every layer's projections and MLP, once per patch) + 2 x head weights x rows (Gemma 3's
projector, Qwen3.5's patch merger: once per output row) + 4 x patches^2 x hidden x layers
(QK^T and PV, bidirectional over the image's patches). The prompt's text FLOPs are
benchmarks.floor.prefill_flops over the non-embedding parameters (the embedding is a gather;
the LM head runs for the last token only).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks import presets
from benchmarks.floor import ModelShape
from engine.models.model_config import ModelConfig
from engine.models.vision import build_vision
from engine.multimodal import ImageInput


@dataclass(frozen=True)
class VisionModel:
    """One benchmarked multimodal shape."""

    preset: str
    """The text model's preset (profiles/models/NAME.json)."""
    top: dict
    """The top level of config.json beside text_config and vision_config."""
    vision: dict
    tiny_vision: dict
    """The same tower with small dimensions (--tiny: a quick CPU run)."""
    image: tuple[int, int]
    """(width, height) in pixels of the benchmark's image."""
    tiny_image: tuple[int, int]
    start_end: tuple[str, str]
    """config.json keys of the tokens before and after an image's placeholders."""


MODELS = {
    "gemma3-12b": VisionModel(
        preset="gemma-3-12b",
        top=dict(
            architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3",
            mm_tokens_per_image=256, image_token_index=262144, boi_token_index=255999,
            eoi_token_index=256000,
        ),
        vision=dict(
            model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304,
            num_hidden_layers=27, num_attention_heads=16, patch_size=14, image_size=896,
            vision_use_head=False,
        ),
        tiny_vision=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=2, patch_size=4, image_size=32,
            vision_use_head=False,
        ),
        image=(896, 896),
        tiny_image=(32, 32),
        start_end=("boi_token_index", "eoi_token_index"),
    ),
    "qwen3.5-27b": VisionModel(
        preset="qwen3.5-27b",
        top=dict(
            architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5",
            image_token_id=248056, video_token_id=248057, vision_start_token_id=248053,
            vision_end_token_id=248054, tie_word_embeddings=False,
        ),
        vision=dict(
            model_type="qwen3_5_vision", depth=27, hidden_size=1152, intermediate_size=4304,
            num_heads=16, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
            num_position_embeddings=2304, hidden_act="gelu_pytorch_tanh",
        ),
        tiny_vision=dict(
            model_type="qwen3_5_vision", depth=2, hidden_size=32, intermediate_size=48,
            num_heads=2, patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
            num_position_embeddings=16, hidden_act="gelu_pytorch_tanh",
        ),
        image=(1280, 720),  # a screenshot
        tiny_image=(64, 36),
        start_end=("vision_start_token_id", "vision_end_token_id"),
    ),
}  # fmt: skip
TINY_MM_TOKENS = 16
"""Gemma 3's placeholders per image with the tiny tower (a 4 x 4 pool of its 8 x 8 patches)."""
ID_KEYS = ("_token_id", "_token_index")
"""config.json keys of special token ids (image placeholder, image start and end...)."""
HEAD_PREFIXES = ("multi_modal_projector.", "merger.")
"""The encoder's modules that run once per output row, not once per patch."""


def checkpoint_config(model: str, tiny: bool = False) -> dict:
    """The whole config.json of MODELS[model]: its preset (with tiny layers where `tiny`) as
    text_config, the tower's values as vision_config."""
    spec = MODELS[model]
    text = presets.load_preset(spec.preset, tiny)
    top = {k: text.pop(k) for k in ("architectures", "dtype", "torch_dtype") if k in text}
    vision = dict(spec.tiny_vision if tiny else spec.vision)
    if "out_hidden_size" not in vision and spec.top["model_type"] == "qwen3_5":
        vision["out_hidden_size"] = text["hidden_size"]
    config = {**spec.top, "text_config": text, "vision_config": vision}
    config["eos_token_id"] = text.get("eos_token_id")
    config["torch_dtype"] = top.get("torch_dtype") or top.get("dtype") or "bfloat16"
    if tiny:  # the special ids at the top of the tiny vocabulary
        top_id = text["vocab_size"] - 1
        config.update({k: top_id - i for i, k in enumerate(spec.top) if k.endswith(ID_KEYS)})
        if spec.top["model_type"] == "gemma3":
            config["mm_tokens_per_image"] = TINY_MM_TOKENS
    return config


def write_folder(config: dict, folder: Path) -> Path:
    """A model folder holding only config.json: enough for load_format="random"."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def image_token(config: dict) -> int:
    return config.get("image_token_index") or config["image_token_id"]


def qwen_grid(vision: dict, width: int, height: int) -> tuple[int, int, int]:
    """(t, h, w) in patches of one image as the Qwen2-VL processor resizes it: both sides
    rounded to the nearest multiple of patch x merge (transformers' smart_resize, whose pixel
    bounds the benchmark's images stay within)."""
    factor = vision["patch_size"] * vision["spatial_merge_size"]
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        h, w = smart_resize(height, width, factor=factor, min_pixels=factor**2)
    except ImportError:  # the rule it applies within its bounds
        h, w = (max(factor, round(s / factor) * factor) for s in (height, width))
    return 1, h // vision["patch_size"], w // vision["patch_size"]


@dataclass(frozen=True)
class ImageShape:
    """What one benchmark image costs the encoder."""

    num_patches: int
    """Patches through the tower."""
    num_tokens: int
    """Encoder output rows: its placeholders in the prompt."""


def image_shape(config: dict, width: int, height: int) -> ImageShape:
    vision = config["vision_config"]
    if config["model_type"] == "gemma3":  # the processor resizes to image_size square
        return ImageShape((vision["image_size"] // vision["patch_size"]) ** 2,
                          config["mm_tokens_per_image"])  # fmt: skip
    t, h, w = qwen_grid(vision, width, height)
    return ImageShape(t * h * w, t * h * w // vision["spatial_merge_size"] ** 2)


def random_image(config: dict, width: int, height: int, seed: int) -> dict[str, torch.Tensor]:
    """The processor's tensors of a random image (values in its normalised [-1, 1] range)."""
    vision = config["vision_config"]
    g = torch.Generator().manual_seed(seed)
    if config["model_type"] == "gemma3":
        side = vision["image_size"]
        return {"pixel_values": torch.rand(1, 3, side, side, generator=g) * 2 - 1}
    grid = qwen_grid(vision, width, height)
    dim = 3 * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    pixels = torch.rand(math.prod(grid), dim, generator=g) * 2 - 1  # [t*h*w, C*T*P*P]
    return {"pixel_values": pixels, "image_grid_thw": torch.tensor([grid])}


def image_prompt(
    config: dict, model: str, data: dict[str, torch.Tensor], question: list[int], n_tokens: int
) -> tuple[list[int], list[ImageInput]]:
    """<start> placeholders <end> question: token ids and the image's ImageInput."""
    start, end = (config[k] for k in MODELS[model].start_end)
    ids = [start] + [image_token(config)] * n_tokens + [end] + list(question)
    return ids, [ImageInput(1, n_tokens, data)]


def random_text(config: dict, n: int, seed: int) -> list[int]:
    """n token ids below every special id of config.json's top level (image, start, end)."""
    lowest = min(v for k, v in config.items() if k.endswith(ID_KEYS) and k != "eos_token_id")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, lowest, (n,), generator=g).tolist()


@dataclass(frozen=True)
class EncoderShape:
    """The numbers of a vision encoder its FLOPs need."""

    tower_params: int
    """Projection weights every patch goes through (patch embedding, attention, MLP)."""
    head_params: int
    """Projection weights every output row goes through (projector or merger)."""
    hidden_size: int
    num_layers: int


def encoder_shape(config: dict) -> EncoderShape:
    """The engine's own encoder of `config`, built on the meta device, its projection
    weights counted: every matrix but the position-embedding tables (norms and biases, 1-D,
    left out)."""
    with torch.device("meta"):
        vision = build_vision(config)
    tower = head = 0
    for name, module in vision.named_modules():
        if isinstance(module, torch.nn.Embedding):
            continue
        weights = sum(p.numel() for p in module.parameters(recurse=False) if p.dim() >= 2)
        if name.startswith(HEAD_PREFIXES):
            head += weights
        else:
            tower += weights
    v = config["vision_config"]
    layers = v.get("num_hidden_layers") or v["depth"]
    return EncoderShape(tower, head, v["hidden_size"], layers)


def encoder_flops(shape: EncoderShape, num_patches: int, num_rows: int) -> float:
    """One image's encoder FLOPs (the module docstring)."""
    dense = 2.0 * (shape.tower_params * num_patches + shape.head_params * num_rows)
    return dense + 4.0 * num_patches**2 * shape.hidden_size * shape.num_layers


def text_shape(config: dict) -> ModelShape:
    """benchmarks.floor's ModelShape of the text model with only its non-embedding parameters
    (with experts, the active ones)."""
    mc = ModelConfig.from_dict(config)
    counts = mc.param_counts()
    shape = ModelShape.from_model_config(mc)
    return dataclasses.replace(
        shape, num_params=counts.linear + counts.other,
        active_params=counts.active_linear + counts.other,
    )  # fmt: skip
