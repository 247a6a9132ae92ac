"""Gemma 3's vision encoder (engine/models/vision/gemma3_vision.py) against transformers'
Gemma3Model.get_image_features on a tiny random checkpoint: the rows each image becomes, for
random pixels and for Pillow images through transformers' Gemma 3 image processor, loaded from
each checkpoint layout, and the load's refusal of a missing, extra or misshapen weight."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from transformers import (
    Gemma3ForConditionalGeneration,
)
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

from engine.models.loader import ParallelCopy, iter_safetensors
from engine.models.vision.gemma3_vision import PREFIXES, Gemma3Vision
from engine.multimodal import ImageInput
from tests.support.tiny_vision import GEMMA3_IMAGE_SIZE, tiny_gemma3_vision

IMAGE_SIZE, TOKENS, TEXT_HIDDEN = GEMMA3_IMAGE_SIZE, 4, 64


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(folder, transformers model, config.json dict) of a tiny random Gemma 3 checkpoint whose
    vision weights are all drawn at random (transformers starts the projector at zeros)."""
    folder = tmp_path_factory.mktemp("gemma3") / "model"
    model = tiny_gemma3_vision(folder, tokens=TOKENS)
    return folder, model, json.loads((folder / "config.json").read_text())


def build(config: dict, weights, dtype=torch.float32) -> Gemma3Vision:
    """Our encoder the way the engine builds it: on meta, cast, materialised, loaded."""
    with torch.device("meta"):
        vision = Gemma3Vision(config)
    vision = vision.to(dtype)
    vision.to_empty(device="cpu")
    vision.load_weights(weights)
    vision.init_buffers(torch.device("cpu"))
    return vision


def vision_weights(folder) -> dict[str, torch.Tensor]:
    return {n: t for n, t in iter_safetensors(folder) if n.startswith(PREFIXES)}


@pytest.fixture(scope="module")
def ours(saved):
    folder, _, config = saved
    with torch.device("meta"):
        vision = Gemma3Vision(config)
    vision.to_empty(device="cpu")
    with ParallelCopy() as copy:
        vision.load_weights(vision_weights(folder).items(), copy)
    vision.init_buffers(torch.device("cpu"))
    return vision


def compare(ours: Gemma3Vision, reference, pixel_values: torch.Tensor) -> None:
    """Our rows for each image of pixel_values [n, 3, S, S], passed as one ImageInput each in
    one call, equal transformers' (fp32, 1e-5)."""
    images = [
        ImageInput(offset=10 * i, length=TOKENS, data={"pixel_values": pixel_values[i : i + 1]})
        for i in range(pixel_values.shape[0])
    ]
    with torch.no_grad():
        expected = reference.model.get_image_features(pixel_values).pooler_output
        got = ours(images)
    assert expected.shape == (pixel_values.shape[0], TOKENS, TEXT_HIDDEN)
    assert expected.abs().max() > 0.1  # a projector of zeros would match anything
    assert len(got) == len(images)
    for row, want in zip(got, expected, strict=True):
        assert row.shape == (TOKENS, TEXT_HIDDEN) and row.dtype == torch.float32
        torch.testing.assert_close(row, want, rtol=1e-5, atol=1e-5)


def test_one_image(saved, ours):
    compare(ours, saved[1], torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE))


def test_two_images_in_one_call(saved, ours):
    pixels = torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE)
    compare(ours, saved[1], pixels)
    # batched, each image's rows are its own: the same as alone
    alone = ours([ImageInput(0, TOKENS, {"pixel_values": pixels[1:]})])[0]
    together = ours([ImageInput(0, TOKENS, {"pixel_values": p[None]}) for p in pixels])[1]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-5)


def exif_rotated_jpeg() -> Image.Image:
    """A 40x24 JPEG whose EXIF says rotate 90 degrees, opened and turned upright (24x40)."""
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (24, 40, 3), np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to view
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(buffer.getvalue())))
    assert upright.size == (24, 40)
    return upright


def pillow_image(kind: str) -> Image.Image:
    rng = np.random.default_rng(0)
    if kind == "odd_size":
        return Image.fromarray(rng.integers(0, 255, (21, 77, 3), np.uint8))
    if kind == "greyscale":
        return Image.fromarray(rng.integers(0, 255, (33, 19), np.uint8), mode="L")
    if kind == "rgba":
        return Image.fromarray(rng.integers(0, 255, (45, 45, 4), np.uint8), mode="RGBA")
    return exif_rotated_jpeg()


@pytest.mark.parametrize("kind", ["odd_size", "greyscale", "rgba", "exif_jpeg"])
def test_processed_pillow_image(saved, ours, kind):
    processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    pixels = processor(images=[pillow_image(kind)], return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 3, IMAGE_SIZE, IMAGE_SIZE)
    compare(ours, saved[1], pixels)


def test_pan_and_scan_crops(saved, ours):
    """A wide image cut into crops: the whole image and each crop, one ImageInput each."""
    processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    pixels = processor(
        images=[pillow_image("odd_size")],
        do_pan_and_scan=True,
        pan_and_scan_min_crop_size=8,
        pan_and_scan_max_num_crops=4,
        pan_and_scan_min_ratio_to_activate=1.2,
        return_tensors="pt",
    )["pixel_values"]
    assert pixels.shape[0] > 2
    compare(ours, saved[1], pixels)


@pytest.mark.parametrize(
    "tower, projector",
    [
        ("model.vision_tower.vision_model.", "model.multi_modal_projector."),
        ("vision_tower.vision_model.", "multi_modal_projector."),  # published checkpoints
        ("model.vision_tower.", "model.multi_modal_projector."),
    ],
)
def test_checkpoint_layouts(saved, tower, projector):
    """The same tensors under each layout's names load into the same encoder."""
    folder, reference, config = saved
    renamed = {
        n.replace("vision_tower.", tower).replace("multi_modal_projector.", projector): t
        for n, t in vision_weights(folder).items()
    }
    assert all(n.startswith((tower, projector)) for n in renamed)
    compare(build(config, renamed.items()), reference, torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE))


def test_bfloat16_matches_transformers_in_bfloat16(saved):
    """In bfloat16 (the serving dtype) our rows stay within a bfloat16 step of transformers'
    in bfloat16 (the rows reach ~4, where a step is 1/64), where both are ~0.02 off fp32."""
    folder, _, config = saved
    ours = build(config, vision_weights(folder).items(), torch.bfloat16)
    reference = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16)
    pixels = torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE)
    images = [ImageInput(0, TOKENS, {"pixel_values": p[None]}) for p in pixels]
    with torch.no_grad():
        got = ours(images)
        want = reference.eval().model.get_image_features(pixels.bfloat16()).pooler_output
    for row, ref in zip(got, want, strict=True):
        assert row.dtype == torch.bfloat16
        torch.testing.assert_close(row.float(), ref.float(), rtol=0, atol=1 / 64)


def test_missing_weight_raises(saved):
    folder, _, config = saved
    weights = vision_weights(folder)
    del weights["vision_tower.encoder.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(ValueError, match="missing.*layers.1.self_attn.k_proj.bias"):
        build(config, weights.items())


@pytest.mark.parametrize(
    "name",
    [
        "vision_tower.encoder.layers.2.mlp.fc1.bias",  # a layer the config does not have
        "multi_modal_projector.extra.weight",
        "language_model.model.norm.weight",  # a text weight: the caller filters by PREFIXES
    ],
)
def test_extra_weight_raises(saved, name):
    folder, _, config = saved
    weights = {**vision_weights(folder), name: torch.zeros(32)}
    with pytest.raises(ValueError, match="unexpected weight"):
        build(config, weights.items())


def test_a_pooling_head_is_skipped(saved, ours):
    """vision_use_head checkpoints hold SigLIP's pooling head: unused, as in transformers."""
    folder, _, config = saved
    weights = {**vision_weights(folder), "vision_tower.head.probe": torch.zeros(1, 1, 32)}
    pixels = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE)
    image = [ImageInput(0, TOKENS, {"pixel_values": pixels})]
    torch.testing.assert_close(build(config, weights.items())(image)[0], ours(image)[0])


def test_misshapen_weight_raises(saved):
    folder, _, config = saved
    weights = vision_weights(folder)
    name = "multi_modal_projector.mm_input_projection_weight"
    weights[name] = weights[name].t()  # [text, vision] where [vision, text] is stored
    with pytest.raises(ValueError, match="shape"):
        build(config, weights.items())


def test_wrong_inputs_raise(ours):
    pixels = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE)
    with pytest.raises(ValueError, match="placeholders"):
        ours([ImageInput(0, TOKENS + 1, {"pixel_values": pixels})])
    with pytest.raises(ValueError, match="pixel_values"):
        ours([ImageInput(0, TOKENS, {"pixel_values": torch.randn(1, 3, 28, 28)})])
    with pytest.raises(ValueError, match="pixel_values"):
        ours([ImageInput(0, TOKENS, {"pixel_values": pixels.expand(2, -1, -1, -1)})])
