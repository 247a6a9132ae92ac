"""The layers of Gemma 4's vision encoder: its RMS norm, the clippable projection, the 2-D
(axial) RoPE, and the encoder layer (bidirectional attention over one image's patches with
q/k/v norms, then a gated MLP, each between a pre- and a post-norm).

The tensors are packed: the patches of every image of a call in one [num_patches, ...] block,
`lengths` telling where each image's patches end; attention runs per image."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import Linear

ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
}
"""config.json's hidden_activation -> the function (Gemma 4 ships gelu_pytorch_tanh)."""


def rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """x / rms(x) (times `weight`, used as stored), computed in fp32 and returned in x's
    dtype: transformers' Gemma4RMSNorm, whose weight multiplies before the rounding."""
    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        h = h * weight.float()
    return h.to(x.dtype)


class Norm(nn.Module):
    """RMS norm over the last dim with a learned scale (`weight`, x * w)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps, self.weight)


class ClippableLinear(nn.Module):
    """A bias-free projection (`linear`, a quantizable Linear). With `clipped`, its input is
    clamped to [input_min, input_max] and its output to [output_min, output_max], four scalars
    the checkpoint stores next to the weight (config use_clipped_linears)."""

    def __init__(self, in_features: int, out_features: int, clipped: bool) -> None:
        super().__init__()
        self.linear = Linear(in_features, out_features, bias=False)
        self.clipped = clipped
        if clipped:
            for bound in ("input_min", "input_max", "output_min", "output_max"):
                self.register_buffer(bound, torch.empty(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return self.linear(x)
        x = torch.clamp(x, self.input_min, self.input_max)
        return torch.clamp(self.linear(x), self.output_min, self.output_max)


def axial_inv_freq(head_dim: int, theta: float, device: torch.device | str) -> torch.Tensor:
    """[head_dim // 4] fp32: the frequencies each of the two axes rotates its half of the head
    with (the first half by x, the second by y)."""
    half = head_dim // 2
    exponents = torch.arange(0, half, 2, dtype=torch.float32, device=device) / half
    return 1.0 / theta**exponents


def axial_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [num_patches, head_dim] in `dtype`, for patch `positions`
    [num_patches, 2] (x, y): laid out x, x, y, y, each a quarter of the head."""
    angles = positions.float()[..., None] * inv_freq  # [num_patches, 2, head_dim // 4]
    x, y = angles[:, 0], angles[:, 1]
    angles = torch.cat((x, x, y, y), dim=-1)  # [num_patches, head_dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_axial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x [num_patches, num_heads, head_dim]: each half of the head (x axis, then y)
    rotated as its own half-split pair (first quarter with second)."""
    quarters = x.unflatten(-1, (2, 2, -1))  # [num_patches, num_heads, axis, pair, head_dim // 4]
    rotated = torch.stack((-quarters[..., 1, :], quarters[..., 0, :]), dim=-2).flatten(-3)
    return x * cos[:, None] + rotated * sin[:, None]


class Attention(nn.Module):
    """Bidirectional attention over each image's patches: q and k RMS-normed (with scale) and
    rotated by their 2-D positions, v RMS-normed (without scale), scores unscaled (the norms
    fix their size), K/V heads shared by groups of query heads."""

    def __init__(self, vc: dict) -> None:
        super().__init__()
        hidden, self.head_dim = vc["hidden_size"], vc["head_dim"]
        self.num_heads, self.num_kv_heads = vc["num_attention_heads"], vc["num_key_value_heads"]
        self.eps, clipped = vc["rms_norm_eps"], vc["use_clipped_linears"]
        self.q_proj = ClippableLinear(hidden, self.num_heads * self.head_dim, clipped)
        self.k_proj = ClippableLinear(hidden, self.num_kv_heads * self.head_dim, clipped)
        self.v_proj = ClippableLinear(hidden, self.num_kv_heads * self.head_dim, clipped)
        self.o_proj = ClippableLinear(self.num_heads * self.head_dim, hidden, clipped)
        self.q_norm = Norm(self.head_dim, self.eps)
        self.k_norm = Norm(self.head_dim, self.eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        # x: [num_patches, hidden]; cos, sin: [num_patches, head_dim]
        q = self.q_norm(self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)))
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)))
        v = rms_norm(self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)), self.eps)
        q, k = apply_axial_rope(q, cos, sin), apply_axial_rope(k, cos, sin)
        if self.num_kv_heads != self.num_heads:
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = [
            F.scaled_dot_product_attention(
                qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1), scale=1.0
            )
            for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True)
        ]  # each [num_heads, image's patches, head_dim]
        out = torch.cat(out, dim=1).transpose(0, 1).flatten(1)  # [num_patches, heads * head_dim]
        return self.o_proj(out)


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)), each projection clippable."""

    def __init__(self, vc: dict) -> None:
        super().__init__()
        hidden, inner, clipped = (
            vc["hidden_size"],
            vc["intermediate_size"],
            vc["use_clipped_linears"],
        )
        if vc["hidden_activation"] not in ACTIVATIONS:
            raise ValueError(
                f"unsupported vision hidden_activation {vc['hidden_activation']!r}; "
                f"supported: {', '.join(ACTIVATIONS)}"
            )
        self.act = ACTIVATIONS[vc["hidden_activation"]]
        self.gate_proj = ClippableLinear(hidden, inner, clipped)
        self.up_proj = ClippableLinear(hidden, inner, clipped)
        self.down_proj = ClippableLinear(inner, hidden, clipped)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class EncoderLayer(nn.Module):
    """x + post_norm(attn(pre_norm(x))), then the same around the MLP."""

    def __init__(self, vc: dict) -> None:
        super().__init__()
        hidden, eps = vc["hidden_size"], vc["rms_norm_eps"]
        self.self_attn = Attention(vc)
        self.mlp = MLP(vc)
        self.input_layernorm = Norm(hidden, eps)
        self.post_attention_layernorm = Norm(hidden, eps)
        self.pre_feedforward_layernorm = Norm(hidden, eps)
        self.post_feedforward_layernorm = Norm(hidden, eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        # x: [num_patches, hidden]
        h = self.self_attn(self.input_layernorm(x), cos, sin, lengths)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)
