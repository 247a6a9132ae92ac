"""Image bytes into the PIL images a processor takes: decoded with Pillow, turned upright by
their EXIF orientation, flattened to RGB, and refused past a pixel limit before their pixels
are decoded."""

from __future__ import annotations

import io
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

MAX_IMAGE_PIXELS = 4096 * 4096
"""The default pixel limit (width x height) of one image: 16,777,216 pixels."""
BACKGROUND = (255, 255, 255)
"""What transparent pixels become: images with alpha are laid over white."""


def decode_image(data: bytes, index: int = 0, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """The RGB image in `data` (any format Pillow reads; an animation's first frame), upright.

    The size is read from the header first: an image of more than `max_pixels` pixels is
    refused before its pixels are decoded (the guard against decompression bombs).

    Raises:
        ValueError: `data` is not an image Pillow can decode, or it is too large; the message
            names the image by its place in the request (`index`, from 0).
    """
    name = f"image {index}"
    try:
        with warnings.catch_warnings():
            # Pillow warns past its own limit and raises past twice it: ours is checked below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > max_pixels:
            raise ValueError(
                f"{name} is {width}x{height} = {width * height} pixels; this server takes at "
                f"most {max_pixels} pixels an image (--max-image-pixels): send a smaller image"
            )
        image.load()
    except Image.DecompressionBombError as exc:
        raise ValueError(f"{name} is too large to decode: {exc}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError) as exc:
        raise ValueError(
            f"{name} cannot be decoded ({exc}); send a PNG, JPEG, GIF or WebP image"
        ) from None
    return to_rgb(ImageOps.exif_transpose(image))


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` in RGB mode: greyscale and palettes expanded, transparency laid over white."""
    if image.mode == "RGB":
        return image
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if not has_alpha:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")
