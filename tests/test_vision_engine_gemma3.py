"""Gemma 3 with images on the engine against transformers' Gemma3ForConditionalGeneration,
same tiny random weights, fp32 on the CPU: one image, two images in one prompt, an image in
turn 1 and a question in turn 3 (a prefix-cache hit, and a different image with the same
placeholders that is none), steps too small for the prompt (chunks never end inside an image:
its tokens attend to each other both ways), and preemption under a tight KV pool."""

from __future__ import annotations

import copy

import pytest
import torch

from engine import LLM, SamplingParams
from tests.support.greedy_reference import assert_greedy_agrees
from tests.support.tiny_served import tiny_gemma3_served
from tests.support.tiny_vision import (
    GEMMA3_TOKENS,
    gemma3_pixels,
    gemma3_prompt,
    gemma3_reference_inputs,
    random_ids,
    tiny_gemma3_vision,
)

PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=0)
ATOL = 1e-4


def _text(seed: int, n: int) -> list[int]:
    return random_ids(seed, n, 2, 290)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3-vision")
    return folder, tiny_gemma3_vision(folder)


def _check(hf, prompts, outs, pixels) -> None:
    inputs = [gemma3_reference_inputs(p) for p in pixels]
    assert_greedy_agrees(hf, prompts, outs, ATOL, inputs=lambda i, ids: inputs[i](ids))


def _cases():
    one = gemma3_prompt([_text(1, 7), _text(2, 9)], [gemma3_pixels(1)])
    texts = [_text(3, 5), _text(4, 3), _text(5, 6)]
    two = gemma3_prompt(texts, [gemma3_pixels(2), gemma3_pixels(3)])
    return [one, two], [[gemma3_pixels(1)], [gemma3_pixels(2), gemma3_pixels(3)]]


def test_one_and_two_images_agree_with_transformers(gemma3):
    folder, hf = gemma3
    (one, two), pixels = _cases()
    llm = LLM(str(folder), device="cpu", max_model_len=256)
    outs = llm.generate([one[0], two[0]], PARAMS, images=[one[1], two[1]])
    _check(hf, [one[0], two[0]], outs, pixels)
    # the image changes the answer: the same prompt with another image differs
    other = gemma3_prompt([_text(1, 7), _text(2, 9)], [gemma3_pixels(9)])
    changed = llm.generate([other[0]], PARAMS, images=[other[1]])[0]
    assert changed.token_ids != outs[0].token_ids
    assert llm.engine.runner.vision_step.num_cached == 0  # released with their requests


def test_the_next_turn_hits_the_prefix_cache_and_another_image_does_not(gemma3):
    folder, hf = gemma3
    llm = LLM(str(folder), device="cpu", max_model_len=256)
    turn1, images = gemma3_prompt([_text(6, 20), _text(7, 12)], [gemma3_pixels(4)])
    first = llm.generate([turn1], PARAMS, images=[images])[0]
    turn3 = turn1 + first.token_ids + _text(8, 15)
    again = llm.generate([turn3], PARAMS, images=[images])[0]
    image_end = images[0].end
    assert again.num_cached_tokens >= image_end // 16 * 16 > images[0].offset
    _check(hf, [turn3], [again], [[gemma3_pixels(4)]])
    swapped = gemma3_prompt([_text(6, 20), _text(7, 12)], [gemma3_pixels(5)])[1]
    other = llm.generate([turn3], PARAMS, images=[swapped])[0]
    assert other.num_cached_tokens <= images[0].offset  # only the text before the image
    _check(hf, [turn3], [other], [[gemma3_pixels(5)]])


def test_small_steps_never_end_a_chunk_inside_an_image(gemma3):
    folder, hf = gemma3
    (one, two), pixels = _cases()
    llm = LLM(
        str(folder), device="cpu", max_model_len=256, max_num_batched_tokens=GEMMA3_TOKENS + 2
    )
    outs = llm.generate([one[0], two[0]], PARAMS, images=[one[1], two[1]])
    _check(hf, [one[0], two[0]], outs, pixels)
    assert min(o.metrics.num_prefill_chunks for o in outs) >= 2
    for out, (_, images) in zip(outs, (one, two)):
        starts = [e.detail["start"] for e in out.trace if e.event == "prefill_chunk"]
        ends = starts[1:]
        assert not [e for e in ends for i in images if i.offset < e < i.end], starts


def test_preemption_recomputes_with_the_cached_encoder_rows(gemma3):
    folder, hf = gemma3
    prompts, images, pixels = [], [], []
    for k in range(4):
        ids, imgs = gemma3_prompt([_text(10 + k, 6 + k), _text(20 + k, 8)], [gemma3_pixels(k)])
        prompts.append(ids)
        images.append(imgs)
        pixels.append([gemma3_pixels(k)])
    llm = LLM(
        str(folder), device="cpu", max_model_len=112, num_kv_blocks=7, max_num_seqs=4,
        max_num_batched_tokens=40,
    )  # fmt: skip
    outs = llm.generate(prompts, PARAMS, images=images)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    _check(hf, prompts, outs, pixels)
    encoded = [e for o in outs for e in o.trace if e.event == "images_encoded"]
    assert sum(e.detail["images"] for e in encoded) == 4  # recomputation re-encoded none
    assert llm.engine.block_manager.num_free_blocks == 7


def test_images_the_engine_cannot_take_are_refused(gemma3):
    folder, _ = gemma3
    llm = LLM(str(folder), device="cpu", max_model_len=256)
    ids, images = gemma3_prompt([_text(1, 4), _text(2, 4)], [gemma3_pixels(1)])
    with pytest.raises(ValueError, match="image token"):
        llm.generate([ids[:-6] + [5] * 6], PARAMS, images=[images])  # a placeholder is text
    with pytest.raises(ValueError, match="prompt's end"):
        llm.generate([ids[: images[0].offset + 3]], PARAMS, images=[images])
    with pytest.raises(ValueError, match="placeholder text"):
        llm.generate([ids], PARAMS)  # placeholders with no image
    small = LLM(str(folder), device="cpu", max_model_len=256, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        small.generate([ids], PARAMS, images=[images])


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_gpu_images_agree_under_small_steps(gemma3, eager):
    """The Triton backend with the image rows attended both ways (fp32), chunked."""
    folder, hf = gemma3
    (one, two), pixels = _cases()
    llm = LLM(
        str(folder), device="cuda", dtype="float32", enforce_eager=eager, max_model_len=256,
        max_num_batched_tokens=GEMMA3_TOKENS + 4,
    )  # fmt: skip
    assert llm.engine.runner.backend.name == "triton"
    outs = llm.generate([one[0], two[0]], PARAMS, images=[one[1], two[1]])
    assert min(o.metrics.num_prefill_chunks for o in outs) >= 2
    _check(copy.deepcopy(hf).cuda(), [one[0], two[0]], outs, pixels)


def test_pan_and_scan_crops_agree_with_transformers(tmp_path):
    """A preprocessor config with pan-and-scan: a wide image becomes the whole image and its
    crops, each its own placeholder run (ImageInput), and the answer is transformers'."""
    from PIL import Image

    from engine.multimodal.processing import ImageProcessor

    hf = tiny_gemma3_served(tmp_path, pan_and_scan=True)
    processor = ImageProcessor.load(tmp_path)
    wide = Image.effect_mandelbrot((96, 32), (-2.0, -1.0, 1.0, 1.0), 60).convert("RGB")
    content = [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]
    ids, images = processor.render([{"role": "user", "content": content}], images=[wide])
    assert len(images) == 4  # the image and 3 crops, in prompt order
    llm = LLM(str(tmp_path), device="cpu", max_model_len=256)
    out = llm.generate([ids], PARAMS, images=[images])
    pixels = [[image.data["pixel_values"] for image in images]]
    token = hf.config.image_token_id

    def inputs(i, seq):
        return {
            "pixel_values": torch.cat(pixels[i]),
            "token_type_ids": (seq == token).long(),
        }

    assert_greedy_agrees(hf, [ids], out, ATOL, inputs=inputs)
