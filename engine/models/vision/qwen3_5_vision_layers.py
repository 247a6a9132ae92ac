"""The layers of Qwen3.5's vision encoder (engine/models/vision/qwen3_5_vision.py): its config,
the ViT block (LayerNorm, attention with 2-D rotary positions, GELU MLP) and the patch merger
that folds each spatial_merge_size x spatial_merge_size block of patches into one row of the
text model's width."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import Linear
from engine.models.vision_params import QWEN3_5_DEFAULTS

_ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
}


DEFAULTS = QWEN3_5_DEFAULTS
"""transformers' Qwen3_5VisionConfig defaults (engine/models/vision_params.py owns them)."""


@dataclass(frozen=True)
class VisionConfig:
    """The fields of config.json's vision_config the encoder reads."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    hidden_act: str
    rope_theta: float

    @classmethod
    def from_dict(cls, vision: dict) -> VisionConfig:
        vision = {**DEFAULTS, **{k: v for k, v in vision.items() if v is not None}}
        rope = vision.get("rope_parameters") or {}
        cfg = cls(
            depth=vision["depth"],
            hidden_size=vision["hidden_size"],
            intermediate_size=vision["intermediate_size"],
            num_heads=vision["num_heads"],
            in_channels=vision.get("in_channels", 3),
            patch_size=vision["patch_size"],
            temporal_patch_size=vision.get("temporal_patch_size", 2),
            spatial_merge_size=vision.get("spatial_merge_size", 2),
            out_hidden_size=vision["out_hidden_size"],
            num_position_embeddings=vision["num_position_embeddings"],
            hidden_act=vision.get("hidden_act", "gelu_pytorch_tanh"),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
        )
        if cfg.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"unsupported vision hidden_act {cfg.hidden_act!r}")
        if cfg.hidden_size % cfg.num_heads or (cfg.hidden_size // cfg.num_heads) % 4:
            raise ValueError("vision head_dim must be a multiple of 4 (two rotary axes)")
        return cfg

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


class VisionAttention(nn.Module):
    """Bidirectional multi-head attention over one frame's patches, 2-D rotary on q and k."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_frames: int
    ) -> torch.Tensor:
        # x: [num_patches, hidden]; cos, sin: [num_patches, head_dim] fp32
        n = x.shape[0]
        qkv = self.qkv(x).view(n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(1)  # each [num_patches, num_heads, head_dim]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # attention stays within a frame: [num_frames, num_heads, frame_patches, head_dim]
        q, k, v = (
            t.reshape(num_frames, -1, self.num_heads, self.head_dim).transpose(1, 2)
            for t in (q, k, v)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(n, -1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the whole head, computed in fp32 (as the reference does)."""
    # x: [num_patches, num_heads, head_dim]; cos, sin: [num_patches, head_dim]
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.linear_fc2 = Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    """Pre-norm ViT block: LayerNorm, attention, residual; LayerNorm, MLP, residual."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_frames: int
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, num_frames)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """LayerNorm per patch, then each merge block's m*m patches concatenated and projected
    (Linear, exact GELU, Linear) to the text model's hidden size."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        merged = cfg.hidden_size * cfg.spatial_merge_size**2
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.linear_fc1 = Linear(merged, merged)
        self.linear_fc2 = Linear(merged, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_patches, hidden] -> [num_patches / m^2, out_hidden]
        x = self.norm(x).reshape(-1, self.linear_fc1.in_features)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))
