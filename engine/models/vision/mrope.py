"""Multimodal rotary positions (M-RoPE) of Qwen3.5's text model: the (temporal, height, width)
position of every prompt token, and the per-token cos/sin that mix the three axes' rotary
tables frequency by frequency.

Text tokens advance all three axes together (position = index + a running offset). An image's
placeholder run of t * (h/m) * (w/m) tokens starts at the current position p and lays out a grid:
temporal p + frame, height p + row, width p + column (rows and columns of merged patches); the
next token then continues at p + max(h, w) / m. So a prompt with images ends before its length,
and a generated token at index i sits at i + delta on all three axes.
"""

from __future__ import annotations

import torch

from engine.multimodal import ImageInput


def mrope_positions(
    token_ids: list[int], images: list[ImageInput], spatial_merge_size: int
) -> tuple[torch.Tensor, int]:
    """[3, len(token_ids)] int64 (temporal, height, width) positions of a prompt whose image
    placeholder runs are `images` (each with `data["image_grid_thw"]` [1, 3] in patches), and
    the delta a later token at index i adds on every axis (position = i + delta). Equals
    transformers' Qwen3_5Model.get_rope_index for one prompt."""
    m = spatial_merge_size
    parts: list[torch.Tensor] = []
    index = 0  # next token to place
    pos = 0  # its position on every axis, were it text
    for image in sorted(images, key=lambda i: i.offset):
        if image.offset < index or image.end > len(token_ids):
            raise ValueError(f"image run [{image.offset}, {image.end}) overlaps or overruns")
        parts.append(_text(pos, image.offset - index))
        pos += image.offset - index
        t, h, w = (int(v) for v in image.data["image_grid_thw"].reshape(3).tolist())
        h, w = h // m, w // m
        if image.length != t * h * w:
            raise ValueError(
                f"grid {(t, h * m, w * m)} gives {t * h * w} tokens, not {image.length}"
            )
        parts.append(_grid(pos, t, h, w))
        pos += max(h, w)
        index = image.end
    parts.append(_text(pos, len(token_ids) - index))
    positions = torch.cat(parts, dim=1)  # [3, len(token_ids)]
    last = int(positions.max()) if positions.numel() else -1
    return positions, last + 1 - len(token_ids)


def _text(start: int, length: int) -> torch.Tensor:
    return torch.arange(start, start + length, dtype=torch.int64).expand(3, length)


def _grid(start: int, t: int, h: int, w: int) -> torch.Tensor:
    """[3, t*h*w]: frame, row, column of each merged patch (raster order), plus `start`."""
    grid = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack(grid).reshape(3, -1).to(torch.int64) + start


def mrope_axes(rotary_dim: int, mrope_section: list[int], interleaved: bool) -> torch.Tensor:
    """[rotary_dim] int64: which axis (0 temporal, 1 height, 2 width) each column of a
    rotate-half cos/sin table takes its position from. Interleaved (Qwen3.5): frequency j
    belongs to height when j % 3 == 1 and j < 3 * section[1], to width when j % 3 == 2 and
    j < 3 * section[2], else to temporal. Not interleaved: consecutive blocks of section[0],
    section[1], section[2] frequencies."""
    half = rotary_dim // 2
    j = torch.arange(half)
    if interleaved:
        axes = torch.zeros(half, dtype=torch.int64)
        axes[(j % 3 == 1) & (j < 3 * mrope_section[1])] = 1
        axes[(j % 3 == 2) & (j < 3 * mrope_section[2])] = 2
    else:
        if sum(mrope_section) != half:
            raise ValueError(f"mrope_section {mrope_section} must sum to {half}")
        bounds = torch.tensor(mrope_section).cumsum(0)
        axes = torch.bucketize(j, bounds, right=True)
    return torch.cat([axes, axes])  # both halves of the rotate-half layout


def mrope_tables(
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    mrope_section: list[int],
    interleaved: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cos and sin [num_tokens, rotary_dim] for 3-D `positions` [3, num_tokens]:
    column c read from the 1-D tables `cos`, `sin` ([max_positions, rotary_dim], rotate-half,
    as engine/models/rope_tables.py builds them) at the position of axis mrope_axes(...)[c].
    With all three axes equal this is cos[positions[0]], sin[positions[0]]. The text config's
    rope_parameters give `mrope_section` and `mrope_interleaved`."""
    axes = mrope_axes(cos.shape[-1], mrope_section, interleaved).to(positions.device)
    index = positions[axes].T  # [num_tokens, rotary_dim]: the position each column reads
    return cos.gather(0, index), sin.gather(0, index)
