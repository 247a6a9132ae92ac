"""Tiny multimodal folders the front end renders images for: a processor (or an image
processor) and byte tokenizer from tests/support/tiny_processors.py, and a tiny random model
of tests/support/tiny_vision.py whose token ids and patch sizes match them."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support.tiny_vision import (
    GEMMA3_IMAGE_SIZE,
    tiny_gemma3_vision,
    tiny_gemma4_vision,
    tiny_qwen3_5_vision,
)


def tiny_gemma3_served(folder: Path, pan_and_scan: bool = False) -> torch.nn.Module:
    """A folder `appliance serve` takes with images: tests/support/tiny_processors.py's Gemma 3
    processor (byte tokenizer, a chat template, 32 x 32 images of 4 placeholders; with
    pan_and_scan its preprocessor config cuts wide images into crops of at least 8 pixels) and
    a tiny random Gemma3ForConditionalGeneration whose ids match its tokenizer's."""
    import json

    from transformers import AutoTokenizer

    from tests.support.tiny_processors import GEMMA3_IMAGE, GEMMA3_TOKENS, gemma3_folder

    gemma3_folder(folder, size=GEMMA3_IMAGE_SIZE)
    if pan_and_scan:
        path = folder / "processor_config.json"
        saved = json.loads(path.read_text())
        saved["image_processor"].update(
            do_pan_and_scan=True,
            pan_and_scan_min_crop_size=8,
            pan_and_scan_max_num_crops=4,
            pan_and_scan_min_ratio_to_activate=1.2,
        )
        path.write_text(json.dumps(saved))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    names = (GEMMA3_IMAGE, GEMMA3_TOKENS["boi_token"], GEMMA3_TOKENS["eoi_token"])
    ids = tuple(tokenizer.convert_tokens_to_ids(n) for n in names)
    return tiny_gemma3_vision(folder, tokens=4, ids=ids, eos=tokenizer.eos_token_id)


def tiny_qwen3_5_served(folder: Path) -> torch.nn.Module:
    """tests/support/tiny_processors.py's Qwen2-VL image processor (8-pixel patches, images of
    at most 64 x 64 pixels) and byte tokenizer, and a tiny random Qwen3.5 whose ids match the
    tokenizer's: the folder the front end renders images for (no torchvision: it expands the
    placeholders itself)."""
    from transformers import AutoTokenizer

    from tests.support.tiny_processors import qwen_vl_folder

    qwen_vl_folder(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    names = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    ids = tuple(tokenizer.convert_tokens_to_ids(n) for n in names)
    return tiny_qwen3_5_vision(folder, ids=ids, vocab_size=320, patch_size=8)


def tiny_gemma4_served(folder: Path) -> torch.nn.Module:
    """tests/support/tiny_processors.py's Gemma 4 tokenizer and an image processor of 2-pixel
    patches pooled 2 x 2, at most 70 soft tokens, and a tiny random Gemma 4 whose ids and patches
    match: the folder the front end renders images for."""
    from transformers import AutoTokenizer
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from tests.support.tiny_processors import GEMMA4_TOKENS, gemma4_folder

    gemma4_folder(folder)
    # 2 x 2 pooling (transformers' own split of pooled rows assumes a kernel above 1)
    Gemma4ImageProcessorPil(
        patch_size=2, max_soft_tokens=70, pooling_kernel_size=2
    ).save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    names = (GEMMA4_TOKENS["image_token"], GEMMA4_TOKENS["boi_token"], GEMMA4_TOKENS["eoi_token"])
    ids = tuple(tok.convert_tokens_to_ids(n) for n in names)
    return tiny_gemma4_vision(folder, ids=ids, patch_size=2, pooling=2, tokenizer=False)
