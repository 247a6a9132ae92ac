"""KVPool: the paged KV cache's tensors and the views each attention layer reads and writes.

The layers that hold K/V are grouped by their (KV heads, head dim), one tensor per group:
[layers in the group, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]. A model
whose layers all have one shape has one tensor. Every group has the same num_blocks, so a
block id names the same tokens in every layer and the block manager stays shape-blind. A layer
that reads another's K/V (LayerAttention.kv_shared_from, Gemma 4's last layers) is bound to
that layer's views and adds nothing to the pool. An int8 cache keeps fp16 scales [layers in
the group, 2, num_blocks, block_size, num_kv_heads] beside each tensor (layout in
engine/kernels/torch_ref.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels.torch_ref import KV_SCALE_DTYPE
from engine.models.model_config import ModelConfig

KV_TENSORS = ("k_cache", "v_cache", "k_scales", "v_scales")
"""Attention-layer attributes that hold views of the KV pool."""


@dataclass
class KVPool:
    tensors: list[torch.Tensor]
    """One per (KV heads, head dim) group, in the order the groups first appear."""
    scales: list[torch.Tensor | None]
    """The int8 cache's scales beside each tensor; None for a 16/32-bit cache."""
    num_blocks: int
    dtype: torch.dtype

    @classmethod
    def empty(cls) -> KVPool:
        return cls([], [], 0, torch.float32)

    @classmethod
    def allocate(
        cls,
        cfg: ModelConfig,
        layers: list,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVPool:
        """Allocate the groups' tensors (zeroed) and bind each of `layers` (the model's
        PagedAttention modules, one per attention layer in order: cfg.attention_layer_ids) to
        its K/V views."""
        layer_ids = cfg.attention_layer_ids()
        if len(layers) != len(layer_ids):
            raise ValueError(
                f"the model has {len(layers)} attention layers, its config {len(layer_ids)}"
            )
        groups: dict[tuple[int, int], list[int]] = {}
        for i in cfg.kv_layers():
            att = cfg.layer_attention(i)
            groups.setdefault((att.num_kv_heads, att.head_dim), []).append(i)
        tensors, scales, where = [], [], {}
        for g, ((kv_heads, head_dim), members) in enumerate(groups.items()):
            shape = (len(members), 2, num_blocks, block_size, kv_heads, head_dim)
            tensors.append(torch.zeros(shape, dtype=dtype, device=device))
            is_int8 = dtype == torch.int8
            scales.append(
                torch.zeros(shape[:-1], dtype=KV_SCALE_DTYPE, device=device) if is_int8 else None
            )
            where.update({layer: (g, j) for j, layer in enumerate(members)})
        pool = cls(tensors, scales, num_blocks, dtype)
        for i, attn in zip(layer_ids, layers, strict=True):
            source = cfg.kv_source(i)
            pool._bind(attn, *where[i if source is None else source])
        return pool

    def _bind(self, attn, group: int, index: int) -> None:
        cache, scales = self.tensors[group], self.scales[group]
        kv_heads, head_dim = cache.shape[-2:]
        if (attn.num_kv_heads, attn.head_dim) != (kv_heads, head_dim):
            raise ValueError(
                f"an attention layer with {attn.num_kv_heads} KV heads of dim {attn.head_dim} "
                f"was given K/V of {kv_heads} heads of dim {head_dim}: the model's layers and "
                "its config disagree"
            )
        attn.k_cache, attn.v_cache = cache[index, 0], cache[index, 1]
        attn.k_scales = attn.v_scales = None
        if scales is not None:
            attn.k_scales, attn.v_scales = scales[index, 0], scales[index, 1]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors) + sum(
            s.nbytes for s in self.scales if s is not None
        )

    @staticmethod
    def unbind(layers: list) -> None:
        """Drop every layer's reference to the pool's views."""
        for attn in layers:
            for name in KV_TENSORS:
                if hasattr(attn, name):
                    setattr(attn, name, None)
