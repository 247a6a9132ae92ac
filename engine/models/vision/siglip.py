"""The SigLIP vision transformer (no pooling head): square images to one row per patch, as
Gemma 3's image encoder runs it before its projector (engine/models/vision/gemma3_vision.py).

Patch embedding (a stride-patch convolution, run as one Linear over the unfolded patches),
learned position embeddings, pre-LayerNorm encoder layers (bidirectional attention with
biases, a gelu-tanh MLP), a final LayerNorm. Parameter names follow the checkpoint's under
`vision_tower.` (`embeddings.patch_embedding.weight`, `encoder.layers.0.self_attn.q_proj.bias`,
`post_layernorm.weight`...); `tower_param_name` maps a checkpoint name onto them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import Linear

ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}
"""config.json's hidden_act -> F.gelu's `approximate`: the activations a SigLIP MLP may use."""


@dataclass(frozen=True)
class SiglipConfig:
    """The vision tower's shape, from config.json's vision_config (transformers' defaults for
    the keys a checkpoint leaves out)."""

    hidden_size: int = 768
    """Width of the patch rows."""
    intermediate_size: int = 3072
    """Width of the MLP's hidden layer."""
    num_layers: int = 12
    """Encoder layers."""
    num_heads: int = 12
    """Attention heads per layer (head_dim = hidden_size / num_heads)."""
    num_channels: int = 3
    """Colour channels of pixel_values."""
    image_size: int = 224
    """Side of the square images the position embeddings were learned for."""
    patch_size: int = 16
    """Side of one square patch: one output row per patch."""
    layer_norm_eps: float = 1e-6
    """Epsilon of every LayerNorm."""
    hidden_act: str = "gelu_pytorch_tanh"
    """The MLP's activation (a key of ACTIVATIONS)."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} not divisible by {self.num_heads}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} not a multiple of {self.patch_size}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported SigLIP activation {self.hidden_act!r}")

    @classmethod
    def from_dict(cls, vision_config: dict) -> SiglipConfig:
        """From config.json's vision_config dict."""
        c = vision_config
        defaults = cls()
        return cls(
            hidden_size=c.get("hidden_size", defaults.hidden_size),
            intermediate_size=c.get("intermediate_size", defaults.intermediate_size),
            num_layers=c.get("num_hidden_layers", defaults.num_layers),
            num_heads=c.get("num_attention_heads", defaults.num_heads),
            num_channels=c.get("num_channels", defaults.num_channels),
            image_size=c.get("image_size", defaults.image_size),
            patch_size=c.get("patch_size", defaults.patch_size),
            layer_norm_eps=c.get("layer_norm_eps", defaults.layer_norm_eps),
            hidden_act=c.get("hidden_act", defaults.hidden_act),
        )

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side**2


class PatchEmbedding(nn.Module):
    """The checkpoint's stride-patch convolution (weight kept in its conv shape), run as one
    Linear over the unfolded patches: the same sums, no convolution kernel."""

    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        self.cfg = cfg
        p = cfg.patch_size
        self.weight = nn.Parameter(torch.empty(cfg.hidden_size, cfg.num_channels, p, p))
        self.bias = nn.Parameter(torch.empty(cfg.hidden_size))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # pixel_values: [num_images, channels, image_size, image_size]
        n, c = pixel_values.shape[:2]
        p, g = self.cfg.patch_size, self.cfg.patches_per_side
        # [n, c, g, p, g, p] -> [n, g, g, c, p, p] -> [n * num_patches, c * p * p]: one row per
        # patch, row-major over the grid, its values in the conv weight's (c, kh, kw) order
        patches = pixel_values.reshape(n, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5)
        patches = patches.reshape(n * g * g, c * p * p)
        return F.linear(patches, self.weight.flatten(1), self.bias)  # [n * num_patches, hidden]


class SiglipEmbeddings(nn.Module):
    """Pixels to patch rows plus their learned position embeddings."""

    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embedding = PatchEmbedding(cfg)
        self.position_embedding = nn.Embedding(cfg.num_patches, cfg.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # pixel_values: [num_images, channels, image_size, image_size]
        cfg = self.cfg
        n, c, h, w = pixel_values.shape
        if (c, h, w) != (cfg.num_channels, cfg.image_size, cfg.image_size):
            raise ValueError(
                f"SigLIP takes pixel_values [n, {cfg.num_channels}, {cfg.image_size}, "
                f"{cfg.image_size}]; got {list(pixel_values.shape)}"
            )
        x = self.patch_embedding(pixel_values)  # [n * num_patches, hidden]
        x = x.view(n, cfg.num_patches, -1) + self.position_embedding.weight
        return x.view(n * cfg.num_patches, -1)


class SiglipAttention(nn.Module):
    """Bidirectional multi-head attention over one image's patches."""

    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.head_dim = d // cfg.num_heads
        self.q_proj = Linear(d, d)
        self.k_proj = Linear(d, d)
        self.v_proj = Linear(d, d)
        self.out_proj = Linear(d, d)

    def forward(self, x: torch.Tensor, num_images: int) -> torch.Tensor:
        # x: [num_images * num_patches, hidden]
        shape = (num_images, -1, self.num_heads, self.head_dim)
        # each [num_images, num_heads, num_patches, head_dim]
        q, k, v = (
            proj(x).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v)  # scale head_dim**-0.5, no mask
        # [num_images, num_patches, num_heads, head_dim] -> [num_images * num_patches, hidden]
        return self.out_proj(out.transpose(1, 2).reshape(x.shape))


class SiglipMLP(nn.Module):
    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        self.approximate = ACTIVATIONS[cfg.hidden_act]
        self.fc1 = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [tokens, hidden] -> [tokens, intermediate] -> [tokens, hidden]
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = SiglipAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = SiglipMLP(cfg)

    def forward(self, x: torch.Tensor, num_images: int) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), num_images)
        return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(nn.Module):
    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(cfg) for _ in range(cfg.num_layers))


class SiglipVisionTower(nn.Module):
    """Images of one size to their patch rows after the final LayerNorm (no pooling head)."""

    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = SiglipEmbeddings(cfg)
        self.encoder = SiglipEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [num_images, channels, image_size, image_size] (cast to the tower's
        dtype) -> [num_images, num_patches, hidden], patches in row-major grid order."""
        num_images = pixel_values.shape[0]
        dtype = self.embeddings.position_embedding.weight.dtype
        x = self.embeddings(pixel_values.to(dtype))  # [num_images * num_patches, hidden]
        for layer in self.encoder.layers:
            x = layer(x, num_images)
        return self.post_layernorm(x).view(num_images, self.cfg.num_patches, -1)


def tower_param_name(name: str) -> str:
    """Our parameter for a checkpoint name with its `vision_tower.` prefix removed: the same,
    less the `vision_model.` level that checkpoints saved by transformers 4 (and the published
    Gemma 3 ones) have and those saved by transformers 5 drop."""
    return name.removeprefix("vision_model.")
