"""The image front end's engine half: image bytes decode upright in RGB within a pixel limit,
and ImageProcessor.render gives transformers' own token ids and tensors, cut into one
ImageInput per placeholder run."""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image

from engine.multimodal.images import decode_image
from engine.multimodal.processing import (
    ImageProcessor,
    model_takes_images,
    placeholder_runs,
    split_images,
)
from tests.support.tiny_models import make_tiny_model
from tests.support.tiny_processors import (
    GEMMA3_TOKENS_PER_IMAGE,
    GEMMA4_TOKENS,
    gemma3_folder,
    gemma4_folder,
    qwen_vl_folder,
)

CHAT = [
    {"role": "system", "content": "be brief"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "compare"},
            {"type": "image"},
            {"type": "text", "text": "with"},
            {"type": "image"},
        ],
    },
]


def encoded(image: Image.Image, fmt: str = "PNG", **save) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save)
    return buffer.getvalue()


def pictures() -> list[Image.Image]:
    """Two images of odd, different sizes with distinct pixels."""
    g = torch.Generator().manual_seed(0)
    out = []
    for w, h in ((37, 23), (19, 41)):
        pixels = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)
        out.append(Image.fromarray(pixels.numpy(), "RGB"))
    return out


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return gemma3_folder(tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return qwen_vl_folder(tmp_path_factory.mktemp("qwen"))


# --- decoding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "P", "LA"])
def test_every_mode_decodes_to_rgb_of_the_same_size(mode):
    image = Image.new(mode, (13, 7))
    fmt = "GIF" if mode == "P" else "PNG"
    out = decode_image(encoded(image, fmt))
    assert (out.mode, out.size) == ("RGB", (13, 7))


def test_transparency_is_laid_over_white():
    image = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    image.putpixel((0, 0), (0, 0, 255, 255))
    out = decode_image(encoded(image))
    assert out.getpixel((1, 1)) == (255, 255, 255)
    assert out.getpixel((0, 0)) == (0, 0, 255)


def test_exif_orientation_turns_a_jpeg_upright():
    image = Image.new("RGB", (30, 10), (250, 250, 250))
    image.paste((0, 0, 0), (0, 0, 5, 10))  # a dark band on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: shown after turning 90 degrees clockwise
    out = decode_image(encoded(image, "JPEG", exif=exif.tobytes()))
    assert out.size == (10, 30)
    assert sum(out.getpixel((5, 2))) < 100  # the band is now at the top
    assert sum(out.getpixel((5, 27))) > 600


def test_too_many_pixels_is_refused_before_decoding():
    data = encoded(Image.new("RGB", (200, 100)))
    assert decode_image(data, 0, max_pixels=20_000).size == (200, 100)
    with pytest.raises(ValueError, match=r"image 3 is 200x100 = 20000 pixels.*at most 19999"):
        decode_image(data, 3, max_pixels=19_999)


@pytest.mark.parametrize(
    "data", [b"", b"not an image at all", encoded(Image.new("RGB", (9, 9)))[:40]]
)
def test_bytes_that_are_no_image_name_the_image(data):
    with pytest.raises(ValueError, match="image 2 cannot be decoded"):
        decode_image(data, 2)


# --- rendering --------------------------------------------------------------------------------
def test_gemma3_render_matches_the_processor(gemma3):
    from transformers import AutoProcessor

    reference = AutoProcessor.from_pretrained(gemma3)
    images = pictures()
    chat = [dict(m) for m in CHAT]
    chat[1] = {
        "role": "user",
        "content": [
            {**p, "image": images[i // 2]} if p["type"] == "image" else p
            for i, p in enumerate(CHAT[1]["content"])
        ],
    }
    want = reference.apply_chat_template(
        chat, tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="pt"
    )
    ids, inputs = ImageProcessor.load(gemma3).render(CHAT, None, None, images)
    assert ids == want["input_ids"][0].tolist()
    assert len(inputs) == 2
    for i, image in enumerate(inputs):
        assert image.length == GEMMA3_TOKENS_PER_IMAGE
        run = ids[image.offset : image.end]
        assert set(run) == {reference.tokenizer.image_token_id}
        assert ids[image.offset - 1] == reference.tokenizer.boi_token_id
        assert list(image.data) == ["pixel_values"]
        assert torch.equal(image.data["pixel_values"], want["pixel_values"][i : i + 1])
    assert inputs[0].hash != inputs[1].hash


def test_qwen_render_expands_each_image_by_its_grid(qwen):
    from transformers import AutoImageProcessor

    images = pictures()
    want = AutoImageProcessor.from_pretrained(qwen)(images, return_tensors="pt")
    processor = ImageProcessor.load(qwen)
    ids, inputs = processor.render(CHAT, None, None, images)
    grid = want["image_grid_thw"]
    rows = [int(g.prod()) for g in grid]
    assert [i.length for i in inputs] == [n // 4 for n in rows]  # 2x2 patches per token
    assert torch.equal(torch.cat([i.data["pixel_values"] for i in inputs]), want["pixel_values"])
    for i, image in enumerate(inputs):
        assert torch.equal(image.data["image_grid_thw"], grid[i : i + 1])
        assert ids[image.offset - 1] == processor.tokenizer.convert_tokens_to_ids(
            "<|vision_start|>"
        )
    text = processor.tokenizer.decode(ids)
    assert text.startswith("<s><system>be brief<user>compare<|vision_start|><|image_pad|>")
    assert text.endswith("<|image_pad|><|vision_end|><assistant>")


def test_gemma4_render_wraps_each_image_s_soft_tokens(tmp_path):
    from transformers import AutoImageProcessor

    folder = gemma4_folder(tmp_path)
    images = pictures()
    want = AutoImageProcessor.from_pretrained(folder)(images, return_tensors="pt")
    processor = ImageProcessor.load(folder)
    ids, inputs = processor.render(CHAT, None, None, images)
    assert [i.length for i in inputs] == want["num_soft_tokens_per_image"].tolist()
    names = (GEMMA4_TOKENS["boi_token"], GEMMA4_TOKENS["eoi_token"])
    boi, eoi = (processor.tokenizer.convert_tokens_to_ids(t) for t in names)
    for i, image in enumerate(inputs):
        assert (ids[image.offset - 1], ids[image.end]) == (boi, eoi)
        assert torch.equal(image.data["pixel_values"], want["pixel_values"][i : i + 1])
        assert torch.equal(image.data["image_position_ids"], want["image_position_ids"][i : i + 1])


def test_text_only_render_and_marker_mismatch(gemma3):
    processor = ImageProcessor.load(gemma3)
    ids, inputs = processor.render([{"role": "user", "content": "hi"}])
    assert inputs == [] and processor.tokenizer.decode(ids) == "<s><user>hi<assistant>"
    with pytest.raises(ValueError):
        processor.render(CHAT, None, None, pictures()[:1])


def test_a_text_model_has_no_image_processor(tmp_path, gemma3):
    folder = make_tiny_model("llama", tmp_path / "llama")
    assert not model_takes_images(folder)
    assert ImageProcessor.load(folder) is None
    assert model_takes_images(gemma3)
    (gemma3 / "processor_config.json").rename(tmp_path / "moved.json")
    try:
        with pytest.raises(ValueError, match="reads images but the folder has no image processor"):
            ImageProcessor.load(gemma3)
    finally:
        (tmp_path / "moved.json").rename(gemma3 / "processor_config.json")
    assert json.loads((gemma3 / "config.json").read_text())["image_token_index"] > 0


def test_placeholder_runs():
    assert placeholder_runs([5, 9, 9, 1, 9, 9, 9], 9) == [(1, 2), (4, 3)]
    assert placeholder_runs([9], 9) == [(0, 1)] and placeholder_runs([1, 2], 9) == []


def test_gemma4_layout_is_cut_one_row_per_run():
    """Gemma 4's processor (it needs torchvision here) gives a padded row per image."""
    out = {
        "input_ids": torch.zeros(1, 30, dtype=torch.long),
        "pixel_values": torch.randn(2, 16, 48),  # [num_images, max_patches, patch_pixels]
        "image_position_ids": torch.randint(0, 4, (2, 16, 2)),
        "num_soft_tokens_per_image": [5, 3],
    }
    first, second = split_images(out, 2)
    assert set(first) == {"pixel_values", "image_position_ids"}
    assert torch.equal(second["pixel_values"], out["pixel_values"][1:2])
    assert torch.equal(second["image_position_ids"], out["image_position_ids"][1:2])
    with pytest.raises(ValueError, match="pixel_values has 2 rows for 3 placeholder runs"):
        split_images(out, 3)
