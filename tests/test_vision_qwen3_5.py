"""Qwen3.5's vision encoder and multimodal RoPE against transformers: a tiny random
Qwen3_5ForConditionalGeneration saved to disk, our encoder built on meta and loaded from it,
images as random patches and as Pillow images through the Qwen2-VL image processor."""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image, ImageOps
from safetensors.torch import load_file
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

from engine.models.rope_tables import rope_tables
from engine.models.vision.mrope import mrope_positions, mrope_tables
from engine.models.vision.qwen3_5_vision import PREFIXES, Qwen3_5Vision
from engine.multimodal import ImageInput
from tests.support.tiny_vision import tiny_qwen3_5_vision

IMAGE_TOKEN, VISION_START, VISION_END = 100, 102, 103
PATCH, MERGE, TEMPORAL = 4, 2, 2
PATCH_DIM = 3 * TEMPORAL * PATCH * PATCH


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(config.json dict, vision weights by name, the transformers model) of a tiny model whose
    vision weights are all drawn at a scale that makes every layer matter."""
    path = tmp_path_factory.mktemp("qwen3_5")
    model = tiny_qwen3_5_vision(path)
    config = json.loads((path / "config.json").read_text())
    weights = load_file(path / "model.safetensors")
    vision = {k: v for k, v in weights.items() if k.startswith(PREFIXES)}
    return config, vision, model


def build(config: dict, weights: dict[str, torch.Tensor]) -> Qwen3_5Vision:
    """The engine's path: built on meta, materialised, loaded, buffers built."""
    with torch.device("meta"):
        vision = Qwen3_5Vision(config)
    vision = vision.to(torch.float32).to_empty(device="cpu")
    vision.load_weights(weights.items())
    vision.init_buffers(torch.device("cpu"))
    return vision


def as_inputs(pixel_values: torch.Tensor, grids: torch.Tensor) -> list[ImageInput]:
    """One ImageInput per image of a processor batch (placeholder offsets are arbitrary)."""
    sizes = grids.prod(-1).tolist()
    out, offset = [], 0
    for pixels, grid in zip(pixel_values.split(sizes), grids):
        length = int(grid.prod()) // MERGE**2
        data = {"pixel_values": pixels, "image_grid_thw": grid[None]}
        out.append(ImageInput(offset, length, data))
        offset += length + 2
    return out


def compare(checkpoint, pixel_values: torch.Tensor, grids: torch.Tensor) -> None:
    config, weights, model = checkpoint
    with torch.no_grad():
        expected = model.model.get_image_features(pixel_values, grids).pooler_output
    ours = build(config, weights)(as_inputs(pixel_values, grids))
    assert len(ours) == len(expected) == len(grids)
    for got, want in zip(ours, expected):
        assert got.shape == want.shape == (int(want.shape[0]), 64)
        assert want.abs().mean() > 0.1  # outputs of a size where a wrong layer shows
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_one_image_matches_transformers(checkpoint):
    torch.manual_seed(1)
    grids = torch.tensor([[1, 6, 4]])
    compare(checkpoint, torch.randn(24, PATCH_DIM), grids)


def test_two_images_of_different_sizes_in_one_call(checkpoint):
    torch.manual_seed(2)
    grids = torch.tensor([[1, 4, 8], [1, 10, 2]])
    compare(checkpoint, torch.randn(52, PATCH_DIM), grids)


def _exif_rotated_jpeg() -> Image.Image:
    """A 40x18 landscape JPEG whose EXIF orientation (6) says: show it rotated, 18x40."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.new("RGB", (40, 18), (200, 30, 90)).save(buf, format="JPEG", exif=exif.tobytes())
    return Image.open(io.BytesIO(buf.getvalue()))


def test_pillow_images_through_the_image_processor(checkpoint):
    torch.manual_seed(3)
    noise = torch.randint(0, 256, (41, 37, 4), dtype=torch.uint8).numpy()
    rotated = ImageOps.exif_transpose(_exif_rotated_jpeg())
    assert rotated.size == (18, 40)
    images = [
        Image.fromarray(noise[:23, :37, :3], "RGB"),  # odd sizes
        Image.fromarray(noise[:31, :29, 0], "L"),  # greyscale
        Image.fromarray(noise, "RGBA"),
        rotated,
    ]
    processor = Qwen2VLImageProcessorPil(
        patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE,
        min_pixels=16 * 16, max_pixels=48 * 48,
    )  # fmt: skip
    batch = processor(images=images, return_tensors="pt")
    grids = batch["image_grid_thw"]
    assert len({tuple(g) for g in grids.tolist()}) >= 3  # several grid shapes in one call
    assert grids[3, 1] > grids[3, 2]  # the rotated photo is taller than wide
    compare(checkpoint, batch["pixel_values"], grids)


def test_visual_prefix_loads_too(checkpoint):
    config, weights, model = checkpoint
    renamed = {k.removeprefix("model."): v for k, v in weights.items()}
    torch.manual_seed(4)
    grids = torch.tensor([[1, 4, 4]])
    pixels = torch.randn(16, PATCH_DIM)
    with torch.no_grad():
        want = model.model.get_image_features(pixels, grids).pooler_output[0]
    got = build(config, renamed)(as_inputs(pixels, grids))[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_missing_or_extra_weight_raises(checkpoint):
    config, weights, _ = checkpoint
    missing = {k: v for k, v in weights.items() if "blocks.1.mlp.linear_fc2.bias" not in k}
    with pytest.raises(ValueError, match="missing"):
        build(config, missing)
    extra = dict(weights)
    extra["model.visual.blocks.2.norm1.weight"] = torch.ones(32)
    with pytest.raises(ValueError, match="unexpected"):
        build(config, extra)
    wrong = dict(weights)
    wrong["model.visual.pos_embed.weight"] = torch.ones(25, 32)
    with pytest.raises(ValueError, match="shape"):
        build(config, wrong)


def test_image_whose_run_does_not_fit_its_grid_raises(checkpoint):
    config, weights, _ = checkpoint
    data = {"pixel_values": torch.randn(16, PATCH_DIM), "image_grid_thw": torch.tensor([[1, 4, 4]])}
    with pytest.raises(ValueError, match="placeholder"):
        build(config, weights)([ImageInput(0, 5, data)])


# --- multimodal RoPE -------------------------------------------------------------------------


def _prompt(layout: list) -> tuple[list[int], list[ImageInput]]:
    """Token ids and ImageInputs for `layout`: an int n is n text tokens, a (t, h, w) tuple an
    image of that patch grid between vision start/end tokens."""
    ids: list[int] = []
    images = []
    for part in layout:
        if isinstance(part, int):
            ids += [(7 * (len(ids) + i)) % 90 for i in range(part)]
            continue
        length = part[0] * part[1] * part[2] // MERGE**2
        ids.append(VISION_START)
        grid = torch.tensor([part])
        data = {"pixel_values": torch.zeros(1), "image_grid_thw": grid}
        images.append(ImageInput(len(ids), length, data))
        ids += [IMAGE_TOKEN] * length + [VISION_END]
    return ids, images


@pytest.mark.parametrize(
    "layout",
    [
        [9],
        [(1, 4, 6)],
        [3, (1, 6, 4), 5],
        [(1, 4, 4), (1, 8, 2)],
        [4, (1, 4, 8), 3, (1, 10, 2), 6],
    ],
    ids=["text", "one-image", "text-image-text", "two-images", "text-between-images"],
)
def test_mrope_positions_match_get_rope_index(checkpoint, layout):
    _, _, model = checkpoint
    ids, images = _prompt(layout)
    positions, delta = mrope_positions(ids, images, MERGE)
    input_ids = torch.tensor([ids])
    grids = torch.cat([i.data["image_grid_thw"] for i in images]) if images else None
    want, want_delta = model.model.get_rope_index(
        input_ids, (input_ids == IMAGE_TOKEN).int(), image_grid_thw=grids
    )
    assert positions.dtype == torch.int64 and positions.shape == (3, len(ids))
    assert torch.equal(positions, want[:, 0])
    assert delta == int(want_delta)
    if images:
        assert delta < 0  # an image spans fewer positions than tokens


def _text_rotary(head_dim: int, section: list[int]) -> Qwen3_5TextRotaryEmbedding:
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": section,
        "mrope_interleaved": True,
    }
    cfg = Qwen3_5TextConfig(
        hidden_size=64, num_attention_heads=4, head_dim=head_dim, rope_parameters=rope
    )
    return Qwen3_5TextRotaryEmbedding(cfg)


@pytest.mark.parametrize("head_dim,section", [(256, [11, 11, 10]), (64, [3, 3, 2])])
def test_mrope_tables_match_transformers(head_dim, section):
    dim = head_dim // 4
    cos, sin = rope_tables(dim, 256, 10000.0, None)
    ids, images = _prompt([4, (1, 4, 8), 3, (1, 10, 2), 6])
    positions, _ = mrope_positions(ids, images, MERGE)
    got_cos, got_sin = mrope_tables(cos, sin, positions, section)
    want_cos, want_sin = _text_rotary(head_dim, section)(
        torch.zeros(1, dtype=torch.float32), positions[:, None]
    )
    assert not torch.equal(got_cos, cos[positions[0]])  # the axes do differ here
    torch.testing.assert_close(got_cos, want_cos[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_sin, want_sin[0], rtol=1e-5, atol=1e-5)


def test_mrope_tables_of_text_positions_are_the_plain_tables():
    cos, sin = rope_tables(64, 128, 10000.0, None)
    index = torch.tensor([0, 5, 6, 7, 100, 127])
    got_cos, got_sin = mrope_tables(cos, sin, index.expand(3, -1), [11, 11, 10])
    assert torch.equal(got_cos, cos[index]) and torch.equal(got_sin, sin[index])
