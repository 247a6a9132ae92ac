"""Qwen3.5 with images on the engine against transformers' Qwen3_5ForConditionalGeneration,
same tiny random weights, fp32 on the CPU: one image, two images of different grids (the
multimodal RoPE positions of the tokens after them), steps small enough to cut through an
image's placeholders (its encoder rows are cached and sliced, not recomputed), preemption."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.support.greedy_reference import assert_greedy_agrees
from tests.support.tiny_served import tiny_qwen3_5_served
from tests.support.tiny_vision import (
    qwen_image,
    qwen_prompt,
    qwen_reference_inputs,
    random_ids,
    tiny_qwen3_5_vision,
)

PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=0)
ATOL = 1e-4


def _text(seed: int, n: int) -> list[int]:
    return random_ids(seed, n, 0, 100)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_5-vision")
    return folder, tiny_qwen3_5_vision(folder)


def _cases():
    one_images = [qwen_image(1, (1, 4, 6))]
    two_images = [qwen_image(2, (1, 8, 4)), qwen_image(3, (1, 2, 10))]
    one = qwen_prompt([_text(1, 7), _text(2, 9)], one_images)
    two = qwen_prompt([_text(3, 5), _text(4, 3), _text(5, 6)], two_images)
    return [one, two], [one_images, two_images]


def _check(hf, prompts, outs, images) -> None:
    inputs = [qwen_reference_inputs(i) for i in images]
    assert_greedy_agrees(hf, prompts, outs, ATOL, inputs=lambda i, ids: inputs[i](ids))


def test_one_and_two_images_agree_with_transformers(qwen):
    folder, hf = qwen
    (one, two), images = _cases()
    llm = LLM(str(folder), device="cpu", max_model_len=256)
    outs = llm.generate([one[0], two[0]], PARAMS, images=[one[1], two[1]])
    _check(hf, [one[0], two[0]], outs, images)
    assert outs[1].prompt_token_ids == two[0]
    other = qwen_prompt([_text(1, 7), _text(2, 9)], [qwen_image(9, (1, 4, 6))])
    changed = llm.generate([other[0]], PARAMS, images=[other[1]])[0]
    assert changed.token_ids != outs[0].token_ids  # the image steers the answer


def test_chunks_cut_through_an_image(qwen):
    folder, hf = qwen
    (one, two), images = _cases()
    llm = LLM(str(folder), device="cpu", max_model_len=256, max_num_batched_tokens=5)
    outs = llm.generate([one[0], two[0]], PARAMS, images=[one[1], two[1]])
    _check(hf, [one[0], two[0]], outs, images)
    for out, (_, imgs) in zip(outs, (one, two)):
        starts = [e.detail["start"] for e in out.trace if e.event == "prefill_chunk"]
        assert [s for s in starts for i in imgs if i.offset < s < i.end]  # inside an image
        encoded = [e for e in out.trace if e.event == "images_encoded"]
        assert sum(e.detail["images"] for e in encoded) == len(imgs)  # each image once


def test_preemption_with_images(qwen):
    folder, hf = qwen
    prompts, inputs, images = [], [], []
    for k in range(4):
        data = [qwen_image(10 + k, (1, 4, 4))]
        ids, imgs = qwen_prompt([_text(20 + k, 5 + k), _text(30 + k, 6)], data)
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
    """The front end's rendering (engine/multimodal/processing.py: the Qwen2-VL image processor,
    placeholders expanded around <|vision_start|>/<|vision_end|>) of two Pillow images of
    different sizes, then the engine, against transformers on the same ids and pixels."""
    from PIL import Image

    from engine.multimodal.processing import ImageProcessor

    hf = tiny_qwen3_5_served(tmp_path)
    processor = ImageProcessor.load(tmp_path)
    wide = Image.effect_mandelbrot((60, 36), (-2.0, -1.0, 1.0, 1.0), 40).convert("RGB")
    tall = Image.linear_gradient("L").resize((24, 52)).convert("RGB")
    content = [
        {"type": "text", "text": "Compare"},
        {"type": "image"},
        {"type": "text", "text": "and"},
        {"type": "image"},
    ]
    ids, images = processor.render([{"role": "user", "content": content}], images=[wide, tall])
    assert len(images) == 2 and images[0].length != images[1].length
    llm = LLM(str(tmp_path), device="cpu", max_model_len=512)
    out = llm.generate([ids], PARAMS, images=[images])
    data = [[image.data for image in images]]
    reference = [qwen_reference_inputs(d, hf.config.image_token_id) for d in data]
    assert_greedy_agrees(hf, [ids], out, ATOL, inputs=lambda i, seq: reference[i](seq))
