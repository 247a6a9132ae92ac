"""Gemma 4's vision encoder (Gemma4Vision): an image's patches embedded with their 2-D position,
run through the bidirectional encoder (engine/models/vision/gemma4_vision_layers.py), average
pooled k x k into the image's soft tokens, scaled by sqrt(hidden), optionally standardized,
then RMS-normed and projected into the text model's hidden size (embed_vision). Computes what
transformers 5's Gemma4Model.get_image_features returns for each image.

Inputs: an ImageInput's `data` holds transformers' Gemma 4 image processor output for that
image alone: `pixel_values` [max_patches, 3 * patch_size**2] of pixels in [0, 1] and
`image_position_ids` [max_patches, 2] of (x, y) patch positions, each with or without a
leading batch dim of 1. Padding patches (position (-1, -1), which the processor appends up to
its patch budget) are dropped before the encoder: transformers masks them out of attention and
zeroes them before pooling, so they change nothing; the front end may strip them itself.
The image's soft tokens, num_soft_tokens_per_image = real patches / k**2, must equal
`ImageInput.length`."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.models.gemma4_config import text_config
from engine.models.layers import Linear
from engine.models.vision.gemma4_vision_layers import (
    EncoderLayer,
    axial_cos_sin,
    axial_inv_freq,
    rms_norm,
)
from engine.models.vision_params import GEMMA4_DEFAULTS
from engine.models.weights import Copy, check_shape, missing_error
from engine.multimodal import ImageInput

PREFIXES = ("model.vision_tower.", "model.embed_vision.", "vision_tower.", "embed_vision.")
"""Checkpoint name prefixes of the encoder and its projection: transformers 5's (under
`model.`), and the same at the top level as transformers 4 laid out multimodal checkpoints."""

VISION_DEFAULTS = GEMMA4_DEFAULTS
"""transformers 5.25's Gemma4VisionConfig defaults (engine/models/vision_params.py owns them)."""


def vision_config(config: dict) -> dict:
    """config.json's vision_config with the defaults filled in, checked."""
    raw = config.get("vision_config")
    if not raw:
        raise ValueError("a Gemma 4 config without a vision_config has no vision encoder")
    vc = {**VISION_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    rope = {**VISION_DEFAULTS["rope_parameters"], **vc["rope_parameters"]}
    if rope["rope_type"] != "axial":
        raise ValueError(f"Gemma 4's vision RoPE must be axial; got {rope['rope_type']!r}")
    if vc["head_dim"] % 4:
        raise ValueError(f"the vision head_dim must be a multiple of 4; got {vc['head_dim']}")
    return {**vc, "rope_theta": float(rope["rope_theta"])}


class PatchEmbedder(nn.Module):
    """Patches [num_patches, 3 * patch_size**2] in [0, 1] -> [num_patches, hidden]: a linear
    map of the pixels scaled to [-1, 1] plus a learned embedding of x and one of y."""

    def __init__(self, vc: dict) -> None:
        super().__init__()
        hidden = vc["hidden_size"]
        self.input_proj = Linear(3 * vc["patch_size"] ** 2, hidden, bias=False)
        self.position_embedding_table = nn.Parameter(
            torch.empty(2, vc["position_embedding_size"], hidden)
        )

    def forward(self, pixels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        table = self.position_embedding_table  # [2, position_embedding_size, hidden]
        x = self.input_proj((2 * (pixels - 0.5)).to(table.dtype))
        return x + table[0][positions[:, 0]] + table[1][positions[:, 1]]


class VisionTower(nn.Module):
    """The encoder proper (checkpoint names under vision_tower.)."""

    def __init__(self, vc: dict) -> None:
        super().__init__()
        self.patch_embedder = PatchEmbedder(vc)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            EncoderLayer(vc) for _ in range(vc["num_hidden_layers"])
        )
        if vc["standardize"]:
            self.register_buffer("std_bias", torch.empty(vc["hidden_size"]))
            self.register_buffer("std_scale", torch.empty(vc["hidden_size"]))
        self.register_buffer("inv_freq", torch.empty(vc["head_dim"] // 4), persistent=False)


class MultimodalEmbedder(nn.Module):
    """Soft tokens into the text model: RMS norm without scale, then a projection."""

    def __init__(self, vc: dict, text_hidden_size: int) -> None:
        super().__init__()
        self.eps = vc["rms_norm_eps"]
        self.embedding_projection = Linear(vc["hidden_size"], text_hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding_projection(rms_norm(x, self.eps))


class Gemma4Vision(nn.Module):
    """Gemma 4's image encoder and its projection into the text model: forward(images) gives
    each image's [num_soft_tokens, text hidden size] rows, in the module's dtype and device."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.vc = vc = vision_config(config)
        self.pool = vc["pooling_kernel_size"]
        self.vision_tower = VisionTower(vc)
        self.embed_vision = MultimodalEmbedder(vc, text_config(config)["hidden_size"])

    def init_buffers(self, device: torch.device | str) -> None:
        """Build the RoPE frequencies (fp32) on `device`: built on meta, nothing survives."""
        self.vision_tower.inv_freq = axial_inv_freq(
            self.vc["head_dim"], self.vc["rope_theta"], device
        )

    def forward(self, images: list[ImageInput]) -> list[torch.Tensor]:
        if not images:
            return []
        tower = self.vision_tower
        table = tower.patch_embedder.position_embedding_table
        device, dtype = table.device, table.dtype
        prepared = [self.prepare_image(image) for image in images]
        pixels = torch.cat([p for p, _ in prepared]).to(device)  # [num_patches, 3 * patch**2]
        positions = torch.cat([q for _, q in prepared]).to(device)  # [num_patches, 2]
        lengths = [len(q) for _, q in prepared]
        x = tower.patch_embedder(pixels, positions)  # [num_patches, hidden]
        cos, sin = axial_cos_sin(positions, tower.inv_freq, x.dtype)
        for layer in tower.encoder.layers:
            x = layer(x, cos, sin, lengths)
        # prepare_image put each pooling cell's k*k patches together, cells in row-major order
        cells = self.pool**2
        pooled = x.float().unflatten(0, (-1, cells)).sum(1) / cells  # [num_soft_tokens, hidden]
        # rounded to the dtype as transformers does, then scaled in fp32 (past fp16's range)
        pooled = pooled.to(dtype).float() * self.vc["hidden_size"] ** 0.5
        if self.vc["standardize"]:
            pooled = (pooled - tower.std_bias.float()) * tower.std_scale.float()
        out = self.embed_vision(pooled.to(dtype))  # [num_soft_tokens, text hidden]
        return list(out.split([n // cells for n in lengths]))

    def prepare_image(self, image: ImageInput) -> tuple[torch.Tensor, torch.Tensor]:
        """One image's real patches and their positions ([n, 3 * patch**2] float, [n, 2] long),
        padding dropped, ordered by pooling cell (cells row-major, the k*k patches of a cell
        together: attention does not depend on the order, the pooling then reads consecutive
        rows). Raises unless the patches tile whole cells and make `image.length` of them."""
        pixels, positions = image.data["pixel_values"], image.data["image_position_ids"]
        pixels = pixels.reshape(-1, pixels.shape[-1])
        positions = positions.reshape(-1, 2).long().cpu()
        if pixels.shape[0] != positions.shape[0]:
            raise ValueError(
                f"pixel_values has {pixels.shape[0]} patches, image_position_ids "
                f"{positions.shape[0]}"
            )
        real = ~(positions == -1).all(-1)
        pixels, positions = pixels[real.to(pixels.device)], positions[real]
        k, num_patches = self.pool, positions.shape[0]
        width = int(positions[:, 0].max()) + 1 if num_patches else 0
        cell = positions[:, 0] // k + (width // k) * (positions[:, 1] // k)
        num_cells = num_patches // k**2
        counts = torch.bincount(cell, minlength=num_cells) if num_patches else cell
        if num_cells * k**2 != num_patches or len(counts) != num_cells or (counts != k**2).any():
            raise ValueError(f"an image's {num_patches} patches do not tile {k}x{k} pooling cells")
        if num_cells != image.length:
            raise ValueError(f"an image of {num_cells} soft tokens for {image.length} placeholders")
        order = torch.sort(cell, stable=True).indices
        return pixels[order.to(pixels.device)], positions[order]

    @torch.no_grad()
    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], copy: Copy = torch.Tensor.copy_
    ) -> None:
        """Copy each checkpoint tensor (named with one of PREFIXES) into its parameter or
        buffer with `copy(dst, src)`; raise on a name not ours, a wrong shape, or a parameter,
        clip bound or standardization buffer left unfilled."""
        targets = self.state_dict(keep_vars=True)
        loaded = set()
        for name, tensor in weights:
            ours = name.removeprefix("model.") if name.startswith(PREFIXES[:2]) else name
            if not name.startswith(PREFIXES) or ours not in targets:
                raise ValueError(f"unexpected weight {name!r} for Gemma 4's vision encoder")
            check_shape(name, tensor, targets[ours])
            copy(targets[ours], tensor)
            loaded.add(ours)
        missing = sorted(set(targets) - loaded)
        if missing:
            raise missing_error("Gemma 4 vision checkpoint", missing)
