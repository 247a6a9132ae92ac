"""Rotary position embedding: the cos/sin tables of each RoPE type (default, linear, llama3,
YaRN, proportional) and the rotate-half rotation, whole-head or partial.

A layer's RoPE is described by its LayerAttention (head_dim, rope_theta, rope_scaling,
partial_rotary_factor); RotaryEmbedding.for_layer builds the tables from that description, so
every family builds them the same way. The scaling dict's `rope_type` is one of the names in
engine.models.model_config.ROPE_TYPES (the torch-free list the config parser accepts).

Partial rotary (partial_rotary_factor < 1): the tables are [max_positions, rotary_dim] and
only the first rotary_dim dims of each head rotate (rotate-half within them); the rest pass
through. The fused Triton kernels (engine/kernels/rope.py, rope_store.py) take a
[max_positions, head_dim] table, so a partial RoPE always runs the PyTorch rotation and the
unfused KV store.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.kernels import fused_kernels_enabled
from engine.models.config_fields import ROPE_TYPES
from engine.models.vision.mrope import mrope_tables


def rotary_dim(head_dim: int, partial_rotary_factor: float) -> int:
    """How many leading dims of a head rotate (as transformers rounds it: int(head_dim x f))."""
    if not 0 < partial_rotary_factor <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor}")
    dim = int(head_dim * partial_rotary_factor)
    if dim % 2 or dim == 0:
        raise ValueError(
            f"RoPE rotates int(head_dim {head_dim} x partial_rotary_factor "
            f"{partial_rotary_factor}) = {dim} dims; that must be even and positive"
        )
    return dim


def inv_freq_and_scale(dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """The [dim // 2] inverse frequencies of a RoPE over `dim` dims, and the factor that
    scales cos and sin (YaRN's attention factor; 1.0 for the others)."""
    rope_type = "default" if scaling is None else scaling.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    return _SCALINGS[rope_type](inv_freq, dim, theta, scaling)


def _default(inv_freq, dim, theta, scaling) -> tuple[torch.Tensor, float]:
    return inv_freq, 1.0


def _linear(inv_freq, dim, theta, scaling) -> tuple[torch.Tensor, float]:
    """Every position divided by factor (Gemma 3's global layers)."""
    return inv_freq / scaling["factor"], 1.0


def _llama3(inv_freq, dim, theta, scaling) -> tuple[torch.Tensor, float]:
    return _llama3_inv_freq(inv_freq, scaling), 1.0


def _yarn(inv_freq, dim, theta, scaling) -> tuple[torch.Tensor, float]:
    return _yarn_inv_freq(dim, theta, scaling), yarn_attention_factor(scaling)


def _proportional(inv_freq, dim, theta, scaling) -> tuple[torch.Tensor, float]:
    """Gemma 4's full layers: the table spans the whole head; the first
    int(partial_rotary_factor x dim // 2) frequencies are the default ones, the rest 0 (those
    dim pairs get cos 1, sin 0: they pass unrotated); all divided by `factor` where set. The
    factor lives in the scaling dict, so the layer's own partial_rotary_factor stays 1 and the
    fused kernels (whole-head tables) serve it."""
    rotated = int(scaling.get("partial_rotary_factor", 1.0) * dim // 2)
    inv_freq = torch.where(torch.arange(dim // 2) < rotated, inv_freq, 0.0)
    return inv_freq / scaling.get("factor", 1.0), 1.0


_SCALINGS = {
    "default": _default,
    "linear": _linear,
    "llama3": _llama3,
    "yarn": _yarn,
    "proportional": _proportional,
}
"""One table builder per name in ROPE_TYPES (tests/test_rope_variants.py checks they match)."""


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth blend between."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN (arXiv 2309.00071): frequencies that turn more than beta_fast times over the
    original context keep their value, those turning fewer than beta_slow times are divided by
    factor, with a linear ramp over the dims between. `truncate` (default true) rounds the
    ramp's ends outward to whole dims; gpt-oss sets it false."""
    factor = scaling["factor"]
    old_len = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def dim_turning(turns: float) -> float:  # the dim whose wavelength fits `turns` times
        return dim * math.log(old_len / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_turning(beta_fast), dim_turning(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # [dim // 2]: 1 where the original frequency stays
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    return 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep


def yarn_attention_factor(scaling: dict) -> float:
    """YaRN's cos/sin scale: `attention_factor` when given, else 0.1 ln(factor) + 1 (or the
    ratio of that with mscale over that with mscale_all_dim, when both are given)."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling["factor"]

    def mscale(weight: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"])
    return mscale()


def rope_tables(
    dim: int, max_positions: int, theta: float, scaling: dict | None, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and sin, each [max_positions, dim] (the two halves repeat: rotate-half), YaRN's
    attention factor applied."""
    inv_freq, scale = inv_freq_and_scale(dim, theta, scaling)
    inv_freq = inv_freq.to(device)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # [max_positions, dim]
    if scale == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * scale, emb.sin() * scale


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with precomputed fp32 [max_positions, rotary_dim] cos/sin tables."""

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict | None = None,
        partial_rotary_factor: float = 1.0,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim(head_dim, partial_rotary_factor)
        self.theta, self.scaling = theta, scaling
        cos, sin = rope_tables(self.rotary_dim, max_positions, theta, scaling)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.mrope: tuple[list[int], bool] | None = None
        """(mrope_section, interleaved) of a model whose positions may come as [3, num_tokens]
        (temporal, height, width: Qwen3.5 with images, engine/models/vision/mrope.py)."""

    @classmethod
    def for_layer(cls, att, max_positions: int) -> RotaryEmbedding:
        """From a LayerAttention (or anything with head_dim, rope_theta, rope_scaling and
        partial_rotary_factor)."""
        return cls(
            att.head_dim, max_positions, att.rope_theta, att.rope_scaling, att.partial_rotary_factor
        )

    @property
    def is_partial(self) -> bool:
        """Only the first rotary_dim dims rotate: the fused kernels do not apply."""
        return self.rotary_dim < self.head_dim

    def init_buffers(self, device: torch.device) -> None:
        """Rebuild the tables (made on meta when the model was) on `device`: computed on the
        CPU, then moved, so every device gets the same fp32 values."""
        cos, sin = rope_tables(self.rotary_dim, self.cos.shape[0], self.theta, self.scaling, "cpu")
        self.cos, self.sin = cos.to(device), sin.to(device)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [num_tokens, num_heads, head_dim], k: [num_tokens, num_kv_heads, head_dim]
        # positions: [num_tokens], or [3, num_tokens] with mrope
        if q.is_cuda and not self.is_partial and positions.dim() == 1 and fused_kernels_enabled():
            from engine.kernels.rope import apply_rope

            return apply_rope(q, k, positions, self.cos, self.sin)  # in place
        cos, sin = self._tables(positions, q.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def rotate_q(self, positions: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """RoPE on q alone ([num_tokens, num_heads, head_dim]), in PyTorch: a layer reading
        another's K/V rotates no keys."""
        return rotate(q, *self._tables(positions, q.dtype))

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype):
        """(cos, sin) [num_tokens, 1, rotary_dim] of the tokens at `positions`."""
        if positions.dim() == 2:
            cos, sin = mrope_tables(self.cos, self.sin, positions, *self.mrope)
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x's first cos.shape[-1] dims; the others pass through unchanged."""
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    head = x[..., :dim]
    return torch.cat([head * cos + _rotate_half(head) * sin, x[..., dim:]], dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
