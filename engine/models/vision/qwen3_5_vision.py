"""Qwen3.5's vision encoder (Qwen3_5ForConditionalGeneration's `model.visual`): each image's
patches embedded, a learned square position grid resampled (bilinear, corners aligned) to the
image's patch grid, ViT blocks attending within the image with 2-D (row, column) rotary
positions, and the merger that turns each spatial_merge_size^2 block of patches into one row of
the text model's hidden size.

Inputs are the Qwen2-VL image processor's, one image per ImageInput: `pixel_values`
[t*h*w, C*T*P*P] (a patch flattened channel, time, row, column; the patches of each
m x m merge block consecutive, blocks in raster order) and `image_grid_thw` [1, 3] = (t, h, w)
in patches. Images of different sizes are encoded one at a time, so attention never crosses
from one image to another.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import Linear
from engine.models.vision.qwen3_5_vision_layers import PatchMerger, VisionBlock, VisionConfig
from engine.models.weights import Copy, check_shape, missing_error
from engine.multimodal import ImageInput

PREFIXES: tuple[str, ...] = ("model.visual.", "visual.")
"""Weight-name prefixes the encoder owns (transformers 5 saves `model.visual.`)."""


class PatchEmbed(nn.Module):
    """The checkpoint's Conv3d whose kernel is its stride (one output per patch), as the Linear
    it equals over a flattened patch: weight [hidden, C*T*P*P]."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.proj = Linear(cfg.patch_dim, cfg.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.proj(pixels)  # [num_patches, C*T*P*P] -> [num_patches, hidden]


class Qwen3_5Vision(nn.Module):
    """The encoder: `forward(images)` gives each image's [t*h*w / m^2, text hidden] rows, the
    embeddings of its image placeholders."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        cfg = self.cfg = VisionConfig.from_dict(config["vision_config"])
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.grid_side = int(cfg.num_position_embeddings**0.5)
        if self.grid_side**2 != cfg.num_position_embeddings:
            raise ValueError("vision num_position_embeddings must be a square")
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)
        self.register_buffer("inv_freq", torch.empty(cfg.head_dim // 4), persistent=False)

    def init_buffers(self, device) -> None:
        """The rotary frequencies, fp32: head_dim // 4 of them, shared by the row and the
        column axis (each axis rotates half the head)."""
        axis_dim = self.cfg.head_dim // 2
        exponents = torch.arange(0, axis_dim, 2, dtype=torch.float32) / axis_dim
        self.inv_freq = (1.0 / self.cfg.rope_theta**exponents).to(device)

    @torch.no_grad()
    def forward(self, images: list[ImageInput]) -> list[torch.Tensor]:
        """Per image [image.length, out_hidden_size], in the module's dtype and device."""
        dtype, device = self.pos_embed.weight.dtype, self.pos_embed.weight.device
        out = []
        for image in images:
            t, h, w = (int(v) for v in image.data["image_grid_thw"].reshape(3).tolist())
            pixels = image.data["pixel_values"].to(device=device, dtype=dtype)
            self._check(image, pixels, t, h, w)
            out.append(self._encode(pixels, t, h, w))
        return out

    def _check(self, image: ImageInput, pixels: torch.Tensor, t: int, h: int, w: int) -> None:
        m = self.cfg.spatial_merge_size
        if h % m or w % m:
            raise ValueError(f"image grid {h}x{w} is not a multiple of spatial_merge_size {m}")
        if tuple(pixels.shape) != (t * h * w, self.cfg.patch_dim):
            raise ValueError(
                f"pixel_values {tuple(pixels.shape)} do not fit grid (t, h, w) = {(t, h, w)}: "
                f"expected {(t * h * w, self.cfg.patch_dim)}"
            )
        if image.length != t * h * w // m**2:
            raise ValueError(
                f"an image of grid {(t, h, w)} gives {t * h * w // m**2} rows; "
                f"its placeholder run has {image.length}"
            )

    def _encode(self, pixels: torch.Tensor, t: int, h: int, w: int) -> torch.Tensor:
        x = self.patch_embed(pixels)  # [t*h*w, hidden]
        x = x + self._position_embeddings(h, w).repeat(t, 1).to(x.dtype)
        cos, sin = self._rotary(h, w)  # each [h*w, head_dim]
        cos, sin = cos.repeat(t, 1), sin.repeat(t, 1)  # [t*h*w, head_dim]
        for block in self.blocks:
            x = block(x, cos, sin, t)
        return self.merger(x)  # [t*h*w / m^2, out_hidden]

    def _position_embeddings(self, h: int, w: int) -> torch.Tensor:
        """The learned side x side grid resampled to h x w (bilinear, corners aligned, fp32),
        in merge-block order: [h*w, hidden]."""
        side = self.grid_side
        grid = self.pos_embed.weight.float().view(side, side, -1).permute(2, 0, 1)[None]
        grid = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=True)
        return self._merge_order(grid[0].permute(1, 2, 0))  # [h, w, hidden] -> [h*w, hidden]

    def _rotary(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos and sin [h*w, head_dim] of each patch's (row, column): the first quarter
        of a half-head turns with the row, the second with the column; rotate-half layout."""
        device = self.inv_freq.device
        rows = torch.arange(h, device=device)[:, None].expand(h, w)
        cols = torch.arange(w, device=device)[None, :].expand(h, w)
        pos = self._merge_order(torch.stack([rows, cols], dim=-1))  # [h*w, 2]
        freqs = (pos[..., None].float() * self.inv_freq).flatten(1)  # [h*w, head_dim // 2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [h*w, head_dim]
        return emb.cos(), emb.sin()

    def _merge_order(self, grid: torch.Tensor) -> torch.Tensor:
        """[h, w, ...] -> [h*w, ...] with each m x m merge block's entries consecutive (the
        processor's patch order)."""
        h, w, m = grid.shape[0], grid.shape[1], self.cfg.spatial_merge_size
        blocks = grid.reshape(h // m, m, w // m, m, *grid.shape[2:]).transpose(1, 2)
        return blocks.reshape(h * w, *grid.shape[2:])

    @torch.no_grad()
    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], copy: Copy = torch.Tensor.copy_
    ) -> None:
        """Copy the checkpoint's encoder tensors (names with one of PREFIXES) into ours: the
        patch Conv3d's [hidden, C, T, P, P] weight flattened to the Linear's. Raises on a name
        without our prefix or with no parameter, on a wrong shape, and on a parameter left
        unfilled."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            prefix = next((p for p in PREFIXES if name.startswith(p)), None)
            target = name[len(prefix) :] if prefix is not None else None
            if target not in params:
                raise ValueError(f"unexpected weight {name!r} for the Qwen3.5 vision encoder")
            if target == "patch_embed.proj.weight" and tensor.dim() == 5:
                tensor = tensor.reshape(tensor.shape[0], -1)
            check_shape(name, tensor, params[target])
            copy(params[target], tensor)
            loaded.add(target)
        missing = sorted(set(params) - loaded)
        if missing:
            raise missing_error("Qwen3.5 vision checkpoint", missing)
