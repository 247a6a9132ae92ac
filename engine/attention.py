"""Attention backends: one interface, a pure-PyTorch implementation (CPU, the reference) and
a Triton one (CUDA). The model's attention layer calls `store_kv` then `attention`."""

from __future__ import annotations

import torch

from engine.context import AttentionMetadata
from engine.kernels import torch_ref


class AttentionBackend:
    """Pure-PyTorch paged attention; the Triton backend overrides the three kernels."""

    name = "torch"

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        torch_ref.store_kv_ref(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        n = meta.num_decodes
        return torch_ref.decode_attention_ref(
            q, k_cache, v_cache, meta.block_tables[:n], meta.seq_lens[:n], scale
        )

    def prefill(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        n = meta.num_decodes
        starts = [s - n for s in meta.query_start_loc_cpu[n:]]
        return torch_ref.prefill_attention_ref(
            q, k_cache, v_cache, meta.block_tables[n:], starts, meta.seq_lens_cpu[n:], scale
        )

    def attention(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        # q: [num_tokens, num_heads, head_dim]; decodes first, then prefill chunks
        n = meta.num_decodes
        if n == meta.num_seqs:
            return self.decode(q, k_cache, v_cache, meta, scale)
        if n == 0:
            return self.prefill(q, k_cache, v_cache, meta, scale)
        out = torch.empty_like(q)
        out[:n] = self.decode(q[:n], k_cache, v_cache, meta, scale)
        out[n:] = self.prefill(q[n:], k_cache, v_cache, meta, scale)
        return out


def select_backend(device: torch.device) -> AttentionBackend:
    """Triton kernels on CUDA when available, else the PyTorch path."""
    if device.type == "cuda":
        try:
            from engine.kernels.triton_backend import TritonBackend
        except ImportError:
            return AttentionBackend()
        return TritonBackend()
    return AttentionBackend()
