"""Images in a prompt: the boundary type that carries one image from the front end to the
engine core (ImageInput), and the helpers the scheduler, the block manager and the runner share.

The front end (engine/multimodal/processing.py, called by the API adapters and LLM) renders
the prompt through the model's transformers processor, which expands each image into a run of
placeholder tokens; it cuts the processor's tensors into one ImageInput per run. The core keys
prefix-cache blocks by the hashes of the images they overlap, runs the model's vision encoder
for the runs a prefill chunk covers (engine/runner/vision_step.py) and writes the encoder's
rows over the placeholders' embeddings.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch-free to import: the block manager keys blocks with images_key
    import torch


@dataclass
class ImageInput:
    """One image (or one crop of one) in a prompt: its encoder inputs and where its
    embeddings go."""

    offset: int
    """Index in the prompt's token ids of the first placeholder this image's embeddings
    replace."""
    length: int
    """How many placeholders (consecutive from `offset`) it fills: the encoder's output rows."""
    data: dict[str, torch.Tensor]
    """The processor's tensors for this image alone (pixel_values, image_grid_thw,
    image_position_ids...), on the CPU, as the family's vision encoder takes them."""
    hash: bytes = field(default=b"")
    """16 bytes identifying the pixels (BLAKE2b of `data`): the prefix-cache and encoder-cache
    key. Filled from `data` when empty."""

    def __post_init__(self) -> None:
        if self.length <= 0 or self.offset < 0:
            raise ValueError(f"an image needs offset >= 0 and length > 0; got {self}")
        if not self.hash:
            self.hash = hash_tensors(self.data)

    @property
    def end(self) -> int:
        """One past the last placeholder it fills."""
        return self.offset + self.length

    def overlaps(self, start: int, end: int) -> bool:
        """Whether its placeholders meet token positions [start, end)."""
        return self.offset < end and start < self.end


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's bytes in its dtype, row-major, from the CPU (what the hash and the core's
    wire carry)."""
    import torch

    t = t.detach().cpu().contiguous()
    return t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def hash_tensors(data: dict[str, torch.Tensor]) -> bytes:
    """BLAKE2b-128 over the names, dtypes, shapes and bytes of `data`, in name order."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(data):
        t = data[name]
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(tensor_bytes(t))
    return digest.digest()


IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index")
"""config.json keys holding the id of the placeholder token the encoder's rows replace."""


def image_token_id(config: dict) -> int | None:
    """The image placeholder's token id of a config.json dict, or None (a text model)."""
    for key in IMAGE_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def images_key(images: list[ImageInput], start: int, end: int) -> bytes:
    """The hashes of the images whose placeholders meet [start, end), with their offsets: the
    part of a prefix-cache block's key that tells two images with the same placeholders apart
    (b"" for a block of text alone)."""
    parts = [i.hash + i.offset.to_bytes(8, "little") for i in images if i.overlaps(start, end)]
    return b"img|" + b"".join(parts) if parts else b""


def check_images(
    token_ids: list[int],
    images: list[ImageInput],
    image_token_id: int | None,
    max_image_tokens: int | None = None,
) -> None:
    """ValueError, saying what is wrong, unless every image's run lies inside the prompt, holds
    only the model's image token, and meets no other image's, and no image token stands
    outside them (typed as text). image_token_id None: the model
    takes text only. max_image_tokens: the most placeholders one image may have (a model whose
    images run whole in one step: the step's token budget)."""
    if image_token_id is None:
        raise ValueError("this model takes text only: send the request without images")
    previous_end = 0
    for n, image in enumerate(sorted(images, key=lambda i: i.offset)):
        if image.offset < previous_end or image.end > len(token_ids):
            raise ValueError(
                f"image {n}: placeholders [{image.offset}, {image.end}) overlap another image or "
                f"pass the prompt's end ({len(token_ids)} tokens)"
            )
        if any(token_ids[p] != image_token_id for p in range(image.offset, image.end)):
            raise ValueError(
                f"image {n}: the prompt's tokens [{image.offset}, {image.end}) must all be the "
                f"image token {image_token_id}"
            )
        if max_image_tokens is not None and image.length > max_image_tokens:
            raise ValueError(
                f"image {n} takes {image.length} tokens and runs whole in one step of at most "
                f"max_num_batched_tokens={max_image_tokens}: raise max_num_batched_tokens"
            )
        previous_end = image.end
    placeholders = token_ids.count(image_token_id)
    if placeholders != sum(image.length for image in images):
        raise ValueError(
            f"the prompt holds {placeholders} image placeholder tokens (id {image_token_id}) "
            f"but its images fill {sum(i.length for i in images)}: send each image as an image "
            "part, not its placeholder text"
        )
