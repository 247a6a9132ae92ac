"""Tiny image-reading model folders (config.json, tokenizer, image processor; no weights) for
the image front end's tests: a Gemma 3 one saved with its whole transformers processor, and
Qwen2-VL and Gemma 4 ones with their image processors alone (those families' processors need
torchvision for their video half). Their tokenizers are the byte tokenizer plus each family's
image tokens, so every id stays below 512 (the fake engine's vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
GEMMA3_IMAGE = "<image_soft_token>"
GEMMA3_TOKENS_PER_IMAGE = 4
QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

_CONTENT = (
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}IMAGE{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
)


def chat_template(image_marker: str) -> str:
    """A chat template that writes `image_marker` for each {"type": "image"} part."""
    content = _CONTENT.replace("IMAGE", image_marker)
    return (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>" + content + "\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )


def _byte_tokenizer(**special) -> PreTrainedTokenizerFast:
    vocab = {f"<0x{i:02X}>": i for i in range(256)}
    vocab.update({"</s>": 256, "<s>": 257, "<pad>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=None))
    tok.decoder = decoders.ByteFallback()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", bos_token="<s>", pad_token="<pad>", **special
    )


def gemma3_folder(folder: Path, size: int = 28) -> Path:
    """A Gemma 3 processor (images resized to size x size, 4 soft tokens each) saved in
    `folder` with a config.json naming its image token."""
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    special = {**GEMMA3_TOKENS, "image_token": GEMMA3_IMAGE}
    tokenizer = _byte_tokenizer(extra_special_tokens=special)
    template = chat_template(GEMMA3_TOKENS["boi_token"])
    tokenizer.chat_template = template
    images = Gemma3ImageProcessorPil(size={"height": size, "width": size})
    processor = Gemma3Processor(
        image_processor=images,
        tokenizer=tokenizer,
        chat_template=template,
        image_seq_length=GEMMA3_TOKENS_PER_IMAGE,
    )
    processor.save_pretrained(folder)
    config = {
        "model_type": "gemma3",
        "image_token_index": tokenizer.image_token_id,
        "mm_tokens_per_image": GEMMA3_TOKENS_PER_IMAGE,
        "vision_config": {"model_type": "siglip_vision_model"},
        "text_config": {"model_type": "gemma3_text"},
    }
    (Path(folder) / "config.json").write_text(json.dumps(config))
    return Path(folder)


def qwen_vl_folder(folder: Path) -> Path:
    """A Qwen2-VL image processor (8-pixel patches, 2x2 merges, at most 64x64 pixels) and
    tokenizer saved in `folder` with a config.json naming its image token."""
    from transformers import Qwen2VLImageProcessorPil

    tokenizer = _byte_tokenizer(additional_special_tokens=QWEN_TOKENS)
    tokenizer.chat_template = chat_template("<|vision_start|><|image_pad|><|vision_end|>")
    tokenizer.save_pretrained(folder)
    images = Qwen2VLImageProcessorPil(
        patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16, max_pixels=64 * 64
    )
    images.save_pretrained(folder)
    config = {
        "model_type": "qwen2_vl",
        "image_token_id": tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        "vision_config": {"patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2},
    }
    (Path(folder) / "config.json").write_text(json.dumps(config))
    return Path(folder)


GEMMA4_TOKENS = {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>"}


def gemma4_folder(folder: Path) -> Path:
    """A Gemma 4 image processor (2-pixel patches, at most 70 soft tokens an image) and
    tokenizer saved in `folder` with a config.json naming its image token."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    tokenizer = _byte_tokenizer(extra_special_tokens=GEMMA4_TOKENS)
    tokenizer.chat_template = chat_template(GEMMA4_TOKENS["image_token"])
    tokenizer.save_pretrained(folder)
    Gemma4ImageProcessorPil(
        patch_size=2, max_soft_tokens=70, pooling_kernel_size=1
    ).save_pretrained(folder)
    config = {
        "model_type": "gemma4",
        "image_token_id": tokenizer.image_token_id,
        "vision_config": {"patch_size": 2, "pooling_kernel_size": 1},
    }
    (Path(folder) / "config.json").write_text(json.dumps(config))
    return Path(folder)
