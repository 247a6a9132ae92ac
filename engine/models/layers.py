"""Building blocks the models share: Linear (the batch-1 Triton GEMV on CUDA, oneDNN on the
CPU), RMSNorm, SiLU-and-mul and paged attention (RoPE is engine/models/rope_tables.py).

Attention writes the new K/V into the paged cache, then reads the cache through the
attention backend the model runner bound (pure PyTorch on CPU, Triton on CUDA).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.env import env_flag
from engine.kernels import fused_kernels_enabled
from engine.kernels.torch_ref import image_attention_ref
from engine.runner.attention_backends import AttentionBackend
from engine.runner.forward_context import get_context

if TYPE_CHECKING:
    from engine.models.rope_tables import RotaryEmbedding


class Linear(nn.Linear):
    """nn.Linear whose batch-1 calls on CUDA run the split-K Triton GEMV where start-up timing
    found it faster than cuBLAS for this shape on this device (engine/kernels/gemv.py, chosen
    by engine/startup/kernel_choices.py where Triton imports). Batches of 2+ rows stay on cuBLAS: a
    tiled Triton GEMM, best config per shape, timed 1.5-1.7x slower at 256 rows (H200)."""

    gemv_config: tuple[int, int, int] | None = None
    """The split-K GEMV config start-up timing kept for one row; None: cuBLAS."""
    silu_config: tuple[int, int, int] | None = None
    """Gate-and-up projections: gemv_silu_mul's config where start-up timing found it faster
    than the GEMV then silu_and_mul; None: the two steps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemv_config is not None and x.is_cuda and x.dim() == 2 and x.shape[0] == 1:
            from engine.kernels.gemv import gemv

            return gemv(x, self.weight, self.bias, self.gemv_config)
        if x.dtype == torch.float32 and not x.is_cuda and x.dim() == 2 and onednn_enabled():
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def fused_silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu_and_mul(self(x)) in one kernel for a gate-and-up projection at one CUDA row,
        where start-up timing kept the fused form; None: the caller runs the two steps."""
        if self.silu_config is None or not x.is_cuda or x.dim() != 2 or x.shape[0] != 1:
            return None
        from engine.kernels.gemv import gemv_silu_mul

        return gemv_silu_mul(x, self.weight, self.bias, self.silu_config)


@cache
def onednn_enabled() -> bool:
    """float32 Linears on the CPU call oneDNN's linear (torch.ops.mkldnn._linear_pointwise)
    instead of F.linear (MKL's sgemm here): measured 1.4-2.7x faster for 1-512 rows on the
    2-core x86 CPU, and 2.3-4x on the embedded model's LM head (docs/performance.md). Off
    where this PyTorch has no oneDNN or APPLIANCE_CPU_ONEDNN is 0."""
    on = env_flag("APPLIANCE_CPU_ONEDNN", default=True)
    return on and torch.backends.mkldnn.is_available() and _has_onednn_linear()


def _has_onednn_linear() -> bool:
    try:
        return hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise x; with `residual`, first add it and also return the sum."""
        if x.is_cuda and fused_kernels_enabled():
            from engine.kernels.rmsnorm import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # x: [num_tokens, 2 * intermediate] (gate, up) -> [num_tokens, intermediate]
    if x.is_cuda and fused_kernels_enabled():
        from engine.kernels.silu_mul import silu_and_mul as fused

        return fused(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class PagedAttention(nn.Module):
    """Stores this step's K/V in the layer's cache views, then attends over the cache.

    A layer's variant (engine/kernels/torch_ref.py says what each means): `window` (sliding
    layers), `softcap`, and `sinks`, a [num_heads] parameter the checkpoint fills.

    `kv_shared`: the layer reads another layer's K/V (the runner binds that layer's cache
    views here) and stores none: forward(q) only attends."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        scale: float | None = None,
        window: int | None = None,
        softcap: float | None = None,
        sinks: bool = False,
        kv_shared: bool = False,
    ) -> None:
        super().__init__()
        self.kv_shared = kv_shared
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.window, self.softcap = window, softcap
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.k_scales: torch.Tensor | None = None  # int8 KV cache only
        self.v_scales: torch.Tensor | None = None
        self.backend: AttentionBackend | None = None
        self.images_both_ways = False
        """An image's placeholder tokens attend to each other both ways (Gemma 3 and 4's
        multimodal models): meta.image_spans' rows are attended again with the image's later
        keys in sight."""
        self.fuse_rope_store = False
        """Set by start-up timing (engine/startup/kernel_choices.py) where the fused kernel proved
        equal to the two and faster on this device."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None
    ) -> torch.Tensor:
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim],
        # None where kv_shared (the producing layer stored this step's K/V already)
        if self.backend is None:
            raise RuntimeError("no KV cache bound to this model (ModelRunner binds it)")
        meta = get_context()
        if self.kv_shared:
            return self.attend(q, meta)
        scales = (self.k_scales, self.v_scales)
        self.backend.store_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping, *scales)
        return self.attend(q, meta)

    def attend(self, q: torch.Tensor, meta) -> torch.Tensor:
        """Attention over the cache, this step's K/V already in it."""
        scales = (self.k_scales, self.v_scales)
        caches = (self.k_cache, self.v_cache)
        if self.window is None and self.softcap is None and self.sinks is None:
            out = self.backend.attention(q, *caches, meta, self.scale, *scales)
            variant = {}
        else:
            variant = {"window": self.window, "softcap": self.softcap, "sinks": self.sinks}
            out = self.backend.attention(q, *caches, meta, self.scale, *scales, **variant)
        if self.images_both_ways and meta.image_spans:
            # [span rows, num_heads, head_dim], over the span's sequence's blocks
            for span in meta.image_spans:
                rows = slice(span.row_start, span.row_end)
                table = meta.block_tables[span.seq]
                out[rows] = image_attention_ref(
                    q[rows], *caches, table, span.first_position, span.key_end, self.scale,
                    *scales, **variant,
                )  # fmt: skip
        return out

    def rope_and_store(
        self, rope: RotaryEmbedding, positions: torch.Tensor, q, k, v
    ) -> torch.Tensor | None:
        """RoPE on q and k and the cache write in one kernel, then attention: for steps of
        fewer than FUSED_ROPE_MAX_TOKENS tokens with a 16-bit cache, where start-up timing
        found the fused kernel equal to the two and faster on this device (fuse_rope_store);
        None otherwise (the caller runs them one by one), always for a partial RoPE (the
        kernel takes whole-head tables) and for a layer that stores no K/V (kv_shared)."""
        if self.kv_shared or not self.fuse_rope_store or q.shape[0] >= FUSED_ROPE_MAX_TOKENS:
            return None
        if rope.is_partial:
            return None
        if self.k_scales is not None or self.backend is None:
            return None
        from engine.kernels.rope_store import rope_store

        meta = get_context()
        caches = (self.k_cache, self.v_cache)
        rope_store(q, k, v, positions, rope.cos, rope.sin, *caches, meta.slot_mapping)
        return self.attend(q, meta)


FUSED_ROPE_MAX_TOKENS = 512
"""rope_and_store serves steps below this many tokens: every decode graph up to 512 rows and
short prefills (chosen by timing decode steps; long prefills keep the two kernels)."""
