"""Gemma4Vision against transformers' Gemma4Model.get_image_features on tiny random models saved
with save_pretrained: built on meta, materialised with to_empty, loaded from the checkpoint's
vision weights; one image, two of different aspect ratios in one call, and Pillow images
(odd sizes, greyscale, RGBA, an EXIF-rotated JPEG) through transformers' Gemma 4 image
processor. Plus the loader's errors on a missing, an extra or a misshapen weight."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from transformers import Gemma4Config, Gemma4ForConditionalGeneration
from transformers.image_utils import load_image
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

from engine.models.vision.gemma4_vision import PREFIXES, Gemma4Vision
from engine.multimodal import ImageInput

TEXT = dict(
    vocab_size=64,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    global_head_dim=16,
    vocab_size_per_layer_input=64,
    hidden_size_per_layer_input=8,
    layer_types=["full_attention"],
)
VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    patch_size=4,
    pooling_kernel_size=2,
    position_embedding_size=64,
    use_clipped_linears=True,
    standardize=True,
)
TOKENS = dict(
    image_token_id=5, boi_token_id=6, eoi_token_id=7, video_token_id=8, boa_token_id=9,
    eoa_token_index=10, audio_token_id=11,
)  # fmt: skip


def save_tiny(folder, **vision_overrides) -> tuple[Gemma4ForConditionalGeneration, dict]:
    """A random Gemma 4 (no audio tower) with spread-out weights, finite clip bounds and a
    standardization, saved in `folder`: (the transformers model, its config.json)."""
    torch.manual_seed(0)
    vision = {**VISION, **vision_overrides}
    config = Gemma4Config(text_config=TEXT, vision_config=vision, audio_config=None, **TOKENS)
    model = Gemma4ForConditionalGeneration(config).eval()
    towers = (model.model.vision_tower, model.model.embed_vision)
    with torch.no_grad():
        for tower in towers:
            for name, t in [*tower.named_parameters(), *tower.named_buffers()]:
                if "norm" in name or name.endswith("std_scale"):
                    t.uniform_(0.5, 1.5)
                elif name.endswith(("input_min", "output_min")):
                    t.fill_(-0.6 if "output" in name else -1.5)
                elif name.endswith(("input_max", "output_max")):
                    t.fill_(0.6 if "output" in name else 1.5)
                elif "inv_freq" not in name:
                    t.normal_(0.0, 0.3 if "position" in name or "std" in name else 0.1)
    model.save_pretrained(folder)
    return model, json.loads((folder / "config.json").read_text())


def vision_weights(folder) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the encoder's prefixes (what the engine hands it)."""
    with safe_open(folder / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith(PREFIXES)}


def build(config: dict, weights, dtype=torch.float32) -> Gemma4Vision:
    with torch.device("meta"):
        vision = Gemma4Vision(config)
    vision = vision.to(dtype)
    vision.to_empty(device="cpu")
    vision.load_weights(weights)
    vision.init_buffers("cpu")
    return vision.eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4-vision")
    model, config = save_tiny(folder)
    return model, config, vision_weights(folder)


@pytest.fixture(scope="module")
def ours(tiny):
    _, config, weights = tiny
    return build(config, weights.items())


def patch_grid(width: int, height: int, max_patches: int, seed: int):
    """Random patches of a width x height grid, row-major, padded to max_patches as the
    processor pads: ([1, max_patches, 48], [1, max_patches, 2])."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.zeros(1, max_patches, 3 * VISION["patch_size"] ** 2)
    positions = torch.full((1, max_patches, 2), -1, dtype=torch.long)
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    pixels[0, : width * height] = torch.rand(width * height, pixels.shape[-1], generator=gen)
    positions[0, : width * height] = torch.stack((xs.flatten(), ys.flatten()), -1)
    return pixels, positions


def reference(model, pixels, positions) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(model.model.get_image_features(pixels, positions).pooler_output)


def encode(vision, datas: list[dict], lengths: list[int]) -> list[torch.Tensor]:
    images, offset = [], 0
    for data, length in zip(datas, lengths, strict=True):
        images.append(ImageInput(offset, length, data))
        offset += length + 3
    with torch.no_grad():
        return vision(images)


def assert_rows_equal(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    assert [o.shape for o in ours] == [t.shape for t in theirs]
    for o, t in zip(ours, theirs, strict=True):
        torch.testing.assert_close(o, t, atol=1e-5, rtol=1e-5)


def test_one_image(tiny, ours):
    model = tiny[0]
    pixels, positions = patch_grid(6, 4, max_patches=36, seed=1)
    theirs = reference(model, pixels, positions)
    data = {"pixel_values": pixels, "image_position_ids": positions}
    out = encode(ours, [data], [6])
    assert out[0].dtype == torch.float32 and out[0].shape == (6, TEXT["hidden_size"])
    assert_rows_equal(out, theirs)


def test_two_aspect_ratios_in_one_call(tiny, ours):
    model = tiny[0]
    wide, tall = patch_grid(8, 4, 36, seed=2), patch_grid(4, 6, 36, seed=3)
    pixels = torch.cat((wide[0], tall[0]))
    positions = torch.cat((wide[1], tall[1]))
    theirs = reference(model, pixels, positions)
    # the first as the processor cut it (padded, batch dim); the second stripped of padding
    datas = [
        {"pixel_values": wide[0], "image_position_ids": wide[1]},
        {"pixel_values": tall[0][0, :24], "image_position_ids": tall[1][0, :24]},
    ]
    assert_rows_equal(encode(ours, datas, [8, 6]), theirs)


def test_clipping_is_live(tiny):
    """The comparisons above see the clip bounds: without them the output moves."""
    model, config, weights = tiny
    unclipped = {
        k: torch.tensor(float("inf") if k.endswith("max") else -float("inf"))
        if k.endswith(("_min", "_max"))
        else v
        for k, v in weights.items()
    }
    pixels, positions = patch_grid(6, 4, 36, seed=1)
    data = {"pixel_values": pixels, "image_position_ids": positions}
    out = encode(build(config, unclipped.items()), [data], [6])[0]
    assert (out - reference(model, pixels, positions)[0]).abs().max() > 1e-2


def exif_rotated_jpeg(path) -> Image.Image:
    """A 52x20 JPEG whose EXIF says 'rotate 90 degrees': upright it is 20x52."""
    image = Image.linear_gradient("L").resize((52, 20)).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to view
    image.save(path, exif=exif.tobytes())
    return load_image(str(path))  # applies the EXIF orientation, as a front end does


def test_pillow_images_through_the_processor(tiny, ours, tmp_path):
    model = tiny[0]
    gen = torch.Generator().manual_seed(4)

    def noise(mode: str, size: tuple[int, int]) -> Image.Image:
        channels = len(Image.new(mode, (1, 1)).getbands())
        pixels = torch.randint(0, 256, (size[1], size[0], channels), generator=gen)
        return Image.fromarray(pixels.squeeze(-1).to(torch.uint8).numpy(), mode)

    upright = exif_rotated_jpeg(tmp_path / "rotated.jpg")
    assert upright.size == (20, 52)
    images = [noise("RGB", (37, 53)), noise("L", (61, 23)), noise("RGBA", (40, 40)), upright]
    processor = Gemma4ImageProcessorPil(patch_size=4, pooling_kernel_size=2, max_soft_tokens=70)
    batch = processor(images, return_tensors="pt")
    pixels, positions = batch["pixel_values"], batch["image_position_ids"]
    lengths = [int(n) for n in batch["num_soft_tokens_per_image"]]
    theirs = reference(model, pixels, positions)
    datas = [
        {"pixel_values": pixels[i : i + 1], "image_position_ids": positions[i : i + 1]}
        for i in range(len(images))
    ]
    assert_rows_equal(encode(ours, datas, lengths), theirs)
    assert len(set(lengths)) > 1  # different shapes, different soft-token counts


def test_pooling_3_unclipped_and_transformers_4_names(tmp_path):
    """A 3x3 pool, no clipping, no standardization, one K/V head per query head; weights
    named as transformers 4 laid out multimodal checkpoints (no `model.`)."""
    model, config = save_tiny(
        tmp_path, pooling_kernel_size=3, use_clipped_linears=False, standardize=False,
        num_key_value_heads=4,
    )  # fmt: skip
    weights = {k.removeprefix("model."): v for k, v in vision_weights(tmp_path).items()}
    assert not any(k.endswith(("_min", "_max", "std_bias")) for k in weights)
    vision = build(config, weights.items())
    pixels, positions = patch_grid(9, 6, 63, seed=5)
    data = {"pixel_values": pixels, "image_position_ids": positions}
    assert_rows_equal(encode(vision, [data], [6]), reference(model, pixels, positions))


def test_bfloat16_rows(tiny, ours):
    _, config, weights = tiny
    vision = build(config, weights.items(), torch.bfloat16)
    pixels, positions = patch_grid(6, 4, 36, seed=1)
    data = {"pixel_values": pixels, "image_position_ids": positions}
    low, full = encode(vision, [data], [6])[0], encode(ours, [data], [6])[0]
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), full, atol=0.05, rtol=0.05)


def test_placeholder_count_must_match(ours):
    pixels, positions = patch_grid(6, 4, 36, seed=1)
    data = {"pixel_values": pixels, "image_position_ids": positions}
    with pytest.raises(ValueError, match="6 soft tokens for 7 placeholders"):
        encode(ours, [data], [7])


def test_missing_extra_or_misshapen_weight_raises(tiny):
    _, config, weights = tiny
    name = "model.vision_tower.encoder.layers.1.self_attn.q_proj.output_max"
    missing = {k: v for k, v in weights.items() if k != name}
    with pytest.raises(ValueError, match="missing.*layers.1.self_attn.q_proj.output_max"):
        build(config, missing.items())
    extra = {
        **weights,
        "model.vision_tower.encoder.layers.2.mlp.up_proj.linear.weight": torch.ones(1),
    }
    with pytest.raises(ValueError, match="unexpected weight.*layers.2.mlp.up_proj"):
        build(config, extra.items())
    audio = {**weights, "model.embed_audio.embedding_projection.weight": torch.ones(1)}
    with pytest.raises(ValueError, match="unexpected weight.*embed_audio"):
        build(config, audio.items())
    table = "model.vision_tower.patch_embedder.position_embedding_table"
    misshapen = {**weights, table: weights[table][:, :10]}
    with pytest.raises(ValueError, match="position_embedding_table.*shape"):
        build(config, misshapen.items())


def test_defaults_match_transformers():
    """A config.json that leaves the vision fields to their defaults (published ones do) gives
    transformers' default tower: the same names and shapes."""
    from transformers import Gemma4VisionConfig, Gemma4VisionModel

    with torch.device("meta"):
        vision = Gemma4Vision({"vision_config": {"model_type": "gemma4_vision"}})
        theirs = Gemma4VisionModel(Gemma4VisionConfig())
    ours = {k: v.shape for k, v in vision.state_dict().items() if k.startswith("vision_tower.")}
    expected = {f"vision_tower.{k}": v.shape for k, v in theirs.state_dict().items()}
    assert ours == expected
    assert vision.embed_vision.embedding_projection.weight.shape == (2304, 768)
