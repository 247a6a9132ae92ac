"""Tiny random multimodal checkpoints (saved with save_pretrained) and prompts holding their
image placeholders, for the engine's exactness tests against transformers with images."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    SiglipVisionConfig,
)

from engine.multimodal import ImageInput
from tests.support.tiny_models import byte_tokenizer

GEMMA3_IMAGE_TOKEN = 299
GEMMA3_IMAGE_SIZE = 32
GEMMA3_TOKENS = 16
"""Placeholders per Gemma 3 image: a 4 x 4 pool of the 8 x 8 patch grid."""


def random_ids(seed: int, n: int, low: int, high: int) -> list[int]:
    """n token ids drawn from [low, high) (a prompt's text around its images)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n,), generator=g).tolist()


def _randomise_vision(model: torch.nn.Module, names: tuple[str, ...]) -> None:
    """Draw the vision weights wide enough that images steer the text (transformers starts the
    projector at zeros); LayerNorm scales near 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(n in name for n in names):
                p.normal_(0.0, 0.2)
                if "norm" in name and name.endswith("weight"):
                    p.add_(1.0)


def tiny_gemma3_vision(
    folder: Path,
    sliding_window: int = 16,
    tokens: int = GEMMA3_TOKENS,
    ids: tuple[int, int, int] = (GEMMA3_IMAGE_TOKEN, 297, 298),
    eos: int = 1,
) -> torch.nn.Module:
    """A Gemma3ForConditionalGeneration of two text layers (one sliding, one full) with a
    2-layer SigLIP tower, `tokens` placeholders per image, ids (image, start of image, end of
    image), saved in `folder`; returns transformers' model (fp32, eval)."""
    vision = SiglipVisionConfig(
        image_size=GEMMA3_IMAGE_SIZE,
        patch_size=4,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        vision_use_head=False,
    )
    text = Gemma3TextConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=1024,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=tokens,
        image_token_id=ids[0],
        boi_token_index=ids[1],
        eoi_token_index=ids[2],
        eos_token_id=eos,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).eval()
    _randomise_vision(model, ("vision_tower", "multi_modal_projector"))
    model.save_pretrained(folder)
    return model


def gemma3_pixels(seed: int) -> torch.Tensor:
    """[1, 3, S, S] pixel values of a random image, in the processor's [-1, 1] range."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 3, GEMMA3_IMAGE_SIZE, GEMMA3_IMAGE_SIZE, generator=g) * 2 - 1


def gemma3_prompt(
    texts: list[list[int]], pixels: list[torch.Tensor]
) -> tuple[list[int], list[ImageInput]]:
    """Token ids of texts[0], image 0, texts[1], image 1, ..., texts[-1] (one more text than
    images), each image as <start_of_image> placeholders <end_of_image>, and its ImageInputs."""
    ids: list[int] = list(texts[0])
    images = []
    for text, pixel_values in zip(texts[1:], pixels, strict=True):
        ids.append(297)
        images.append(ImageInput(len(ids), GEMMA3_TOKENS, {"pixel_values": pixel_values}))
        ids += [GEMMA3_IMAGE_TOKEN] * GEMMA3_TOKENS + [298] + list(text)
    return ids, images


def gemma3_reference_inputs(pixels: list[torch.Tensor]):
    """The reference's extra inputs for a prompt with `pixels`: the images and the token types
    that make transformers attend within each image both ways."""

    def inputs(ids: torch.Tensor) -> dict:
        extra = {"token_type_ids": (ids == GEMMA3_IMAGE_TOKEN).long()}
        if pixels:
            extra["pixel_values"] = torch.cat(pixels).to(ids.device)
        return extra

    return inputs


QWEN_IMAGE_TOKEN, QWEN_VISION_START, QWEN_VISION_END = 100, 102, 103
QWEN_PATCH, QWEN_MERGE, QWEN_TEMPORAL = 4, 2, 2


def tiny_qwen3_5_vision(
    folder: Path,
    ids: tuple[int, int, int, int] = (QWEN_IMAGE_TOKEN, 101, QWEN_VISION_START, QWEN_VISION_END),
    vocab_size: int = 128,
    patch_size: int = QWEN_PATCH,
) -> torch.nn.Module:
    """A Qwen3_5ForConditionalGeneration (one Gated DeltaNet layer, one full-attention layer)
    with a 2-block vision tower, ids (image, video, vision start, vision end), saved in
    `folder`; returns transformers' model (fp32, eval)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    config = Qwen3_5Config(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            max_position_embeddings=1024,
            eos_token_id=vocab_size - 1,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            patch_size=patch_size,
            spatial_merge_size=QWEN_MERGE,
            temporal_patch_size=QWEN_TEMPORAL,
            out_hidden_size=64,
            num_position_embeddings=16,
        ),
        image_token_id=ids[0],
        video_token_id=ids[1],
        vision_start_token_id=ids[2],
        vision_end_token_id=ids[3],
    )
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    _randomise_vision(model, ("visual",))
    model.save_pretrained(folder)
    return model


def qwen_image(seed: int, grid: tuple[int, int, int]) -> dict[str, torch.Tensor]:
    """The processor's tensors of one random image of `grid` (t, h, w) patches."""
    g = torch.Generator().manual_seed(seed)
    t, h, w = grid
    dim = 3 * QWEN_TEMPORAL * QWEN_PATCH * QWEN_PATCH
    return {
        "pixel_values": torch.randn(t * h * w, dim, generator=g),
        "image_grid_thw": torch.tensor([grid]),
    }


def qwen_prompt(
    texts: list[list[int]], images: list[dict[str, torch.Tensor]]
) -> tuple[list[int], list[ImageInput]]:
    """Token ids of texts[0], image 0, texts[1], ..., texts[-1], each image as
    <|vision_start|> placeholders <|vision_end|>, and its ImageInputs."""
    ids: list[int] = list(texts[0])
    inputs = []
    for text, data in zip(texts[1:], images, strict=True):
        ids.append(QWEN_VISION_START)
        length = int(data["image_grid_thw"].prod()) // QWEN_MERGE**2
        inputs.append(ImageInput(len(ids), length, data))
        ids += [QWEN_IMAGE_TOKEN] * length + [QWEN_VISION_END] + list(text)
    return ids, inputs


def qwen_reference_inputs(
    images: list[dict[str, torch.Tensor]], image_token: int = QWEN_IMAGE_TOKEN
):
    """transformers' extra inputs for a prompt with `images` (its M-RoPE needs the types)."""

    def inputs(ids: torch.Tensor) -> dict:
        extra = {"mm_token_type_ids": (ids == image_token).int()}
        if images:
            extra["pixel_values"] = torch.cat([d["pixel_values"] for d in images]).to(ids.device)
            extra["image_grid_thw"] = torch.cat([d["image_grid_thw"] for d in images]).to(
                ids.device
            )
        return extra

    return inputs


GEMMA4_IMAGE_TOKEN, GEMMA4_BOI, GEMMA4_EOI, GEMMA4_PAD = 300, 301, 302, 258
GEMMA4_PATCH = 4


def tiny_gemma4_vision(
    folder: Path,
    ids: tuple[int, int, int] = (GEMMA4_IMAGE_TOKEN, GEMMA4_BOI, GEMMA4_EOI),
    patch_size: int = GEMMA4_PATCH,
    pooling: int = 2,
    tokenizer: bool = True,
) -> torch.nn.Module:
    """A Gemma4ForConditionalGeneration (sliding and full layers, per-layer inputs, images
    attended both ways on the sliding layers) with a 2-layer vision tower and no audio tower,
    saved in `folder`; returns transformers' model (fp32, eval)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1_000.0},
        "full_attention": {
            "rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 50_000.0,
        },
    }  # fmt: skip
    text = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=32,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters=rope,
        final_logit_softcapping=30.0,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=320,
        max_position_embeddings=1024,
        eos_token_id=256,
        bos_token_id=257,
        pad_token_id=GEMMA4_PAD,
        use_bidirectional_attention="vision",
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        patch_size=patch_size,
        pooling_kernel_size=pooling,
        position_embedding_size=64,
    )
    config = Gemma4Config(
        text_config=text, vision_config=vision, audio_config=None,
        image_token_id=ids[0], boi_token_id=ids[1], eoi_token_id=ids[2],
        video_token_id=303, boa_token_id=304, eoa_token_index=305, audio_token_id=306,
    )  # fmt: skip
    config.architectures = ["Gemma4ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(config).eval()
    _randomise_vision(model, ("vision_tower", "embed_vision"))
    model.save_pretrained(folder)
    if tokenizer:
        byte_tokenizer().save_pretrained(folder)
    return model


def gemma4_image(seed: int, width: int, height: int) -> dict[str, torch.Tensor]:
    """The processor's tensors of one random image of width x height patches (row-major, no
    padding): its soft tokens are (width / 2) * (height / 2)."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    return {
        "pixel_values": torch.rand(1, width * height, 3 * GEMMA4_PATCH**2, generator=g),
        "image_position_ids": torch.stack((xs.flatten(), ys.flatten()), -1)[None],
    }


def gemma4_prompt(
    texts: list[list[int]], images: list[dict[str, torch.Tensor]]
) -> tuple[list[int], list[ImageInput]]:
    """Token ids of texts[0], image 0, texts[1], ..., texts[-1], each image as
    <boi> placeholders <eoi>, and its ImageInputs."""
    ids: list[int] = list(texts[0])
    inputs = []
    for text, data in zip(texts[1:], images, strict=True):
        ids.append(GEMMA4_BOI)
        length = data["pixel_values"].shape[1] // 4
        inputs.append(ImageInput(len(ids), length, data))
        ids += [GEMMA4_IMAGE_TOKEN] * length + [GEMMA4_EOI] + list(text)
    return ids, inputs


def gemma4_reference_inputs(
    images: list[dict[str, torch.Tensor]], image_token: int = GEMMA4_IMAGE_TOKEN
):
    """transformers' extra inputs for a prompt with `images`: their patches padded to one
    count (as the processor pads a batch), and the token types of its both-ways attention."""

    def inputs(ids: torch.Tensor) -> dict:
        extra = {"mm_token_type_ids": (ids == image_token).int()}
        if images:
            most = max(d["pixel_values"].shape[1] for d in images)
            pixels, where = [], []
            for d in images:
                n = most - d["pixel_values"].shape[1]
                pixels.append(F.pad(d["pixel_values"], (0, 0, 0, n)))
                where.append(F.pad(d["image_position_ids"], (0, 0, 0, n), value=-1))
            extra["pixel_values"] = torch.cat(pixels).to(ids.device)
            extra["image_position_ids"] = torch.cat(where).to(ids.device)
        return extra

    return inputs
