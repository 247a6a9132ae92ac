"""Gemma 4 with images on the engine against transformers' Gemma4ForConditionalGeneration,
same tiny random weights, fp32 on the CPU: images of two aspect ratios in one prompt (per-layer
inputs read at the pad token for placeholders; an image's tokens attend to each other both ways
on the sliding layers only), small steps, preemption."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.support.greedy_reference import assert_greedy_agrees
from tests.support.tiny_served import tiny_gemma4_served
from tests.support.tiny_vision import (
    gemma4_image,
    gemma4_prompt,
    gemma4_reference_inputs,
    random_ids,
    tiny_gemma4_vision,
)

PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=0)


def _text(seed: int, n: int) -> list[int]:
    return random_ids(seed, n, 0, 256)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4-vision")
    return folder, tiny_gemma4_vision(folder)


def _cases():
    one_images = [gemma4_image(1, 6, 4)]
    two_images = [gemma4_image(2, 8, 4), gemma4_image(3, 4, 6)]
    one = gemma4_prompt([_text(1, 7), _text(2, 9)], one_images)
    two = gemma4_prompt([_text(3, 5), _text(4, 3), _text(5, 12)], two_images)
    return [one, two], [one_images, two_images]


def _check(hf, prompts, outs, images) -> None:
    inputs = [gemma4_reference_inputs(i) for i in images]
    assert_greedy_agrees(hf, prompts, outs, 1e-4, inputs=lambda i, ids: inputs[i](ids))


@pytest.mark.parametrize("step_tokens", [None, 12], ids=["whole", "small-steps"])
def test_images_agree_with_transformers(gemma4, step_tokens):
    folder, hf = gemma4
    (one, two), images = _cases()
    llm = LLM(str(folder), device="cpu", max_model_len=256, max_num_batched_tokens=step_tokens)
    outs = llm.generate([one[0], two[0]], PARAMS, images=[one[1], two[1]])
    _check(hf, [one[0], two[0]], outs, images)
    if step_tokens:
        assert min(o.metrics.num_prefill_chunks for o in outs) >= 2
    other = gemma4_prompt([_text(1, 7), _text(2, 9)], [gemma4_image(9, 6, 4)])
    changed = llm.generate([other[0]], PARAMS, images=[other[1]])[0]
    assert changed.token_ids != outs[0].token_ids  # the image steers the answer


def test_preemption_with_images(gemma4):
    folder, hf = gemma4
    prompts, inputs, images = [], [], []
    for k in range(4):
        data = [gemma4_image(10 + k, 4, 4)]
        ids, imgs = gemma4_prompt([_text(20 + k, 6 + k), _text(30 + k, 8)], data)
        prompts.append(ids)
        inputs.append(imgs)
        images.append(data)
    llm = LLM(
        str(folder), device="cpu", max_model_len=64, num_kv_blocks=5, max_num_seqs=4,
        max_num_batched_tokens=24,
    )  # fmt: skip
    outs = llm.generate(prompts, PARAMS, images=inputs)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    _check(hf, prompts, outs, images)


def test_images_rendered_by_the_front_end_agree_with_transformers(tmp_path):
    """The front end's rendering (the Gemma 4 image processor; placeholders expanded between
    the image's start and end tokens) of two Pillow images, then the engine, against
    transformers on the same ids and pixels."""
    from PIL import Image

    from engine.multimodal.processing import ImageProcessor

    hf = tiny_gemma4_served(tmp_path)
    processor = ImageProcessor.load(tmp_path)
    wide = Image.effect_mandelbrot((30, 14), (-2.0, -1.0, 1.0, 1.0), 40).convert("RGB")
    tall = Image.linear_gradient("L").resize((10, 22)).convert("RGB")
    content = [{"type": "image"}, {"type": "text", "text": "versus"}, {"type": "image"}]
    ids, images = processor.render([{"role": "user", "content": content}], images=[wide, tall])
    assert len(images) == 2
    llm = LLM(str(tmp_path), device="cpu", max_model_len=512)
    out = llm.generate([ids], PARAMS, images=[images])
    token = hf.config.image_token_id
    reference = gemma4_reference_inputs([image.data for image in images], token)
    assert_greedy_agrees(hf, [ids], out, 1e-4, inputs=lambda i, seq: reference(seq))
