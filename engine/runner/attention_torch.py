"""The attention backend interface and its pure-PyTorch implementation (CPU, the reference
the Triton backend in engine/runner/attention_triton.py is tested against)."""

from __future__ import annotations

import torch

from engine.kernels import torch_ref
from engine.runner.forward_context import AttentionMetadata


class AttentionBackend:
    """Pure-PyTorch paged attention; the Triton backend overrides the three kernels."""

    name = "torch"

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None) -> None:
        torch_ref.store_kv_ref(k, v, k_cache, v_cache, slot_mapping, k_scales, v_scales)

    def decode(
        self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, k_scales, v_scales, **var
    ) -> torch.Tensor:
        n = meta.num_decodes
        tables, lens = meta.block_tables[:n], meta.seq_lens[:n]
        return torch_ref.decode_attention_ref(
            q, k_cache, v_cache, tables, lens, scale, k_scales, v_scales, **var
        )

    def prefill(
        self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, k_scales, v_scales, **var
    ) -> torch.Tensor:
        n = meta.num_decodes
        starts = [s - n for s in meta.query_start_loc_cpu[n:]]
        return torch_ref.prefill_attention_ref(
            q,
            k_cache,
            v_cache,
            meta.block_tables[n:],
            starts,
            meta.seq_lens_cpu[n:],
            scale,
            k_scales,
            v_scales,
            **var,
        )

    def attention(
        self,
        q,
        k_cache,
        v_cache,
        meta: AttentionMetadata,
        scale: float,
        k_scales=None,
        v_scales=None,
        **var,
    ):
        # q: [num_tokens, num_heads, head_dim]; decodes first, then prefill chunks
        n = meta.num_decodes
        scales = (k_scales, v_scales)
        if n == meta.num_seqs:
            return self.decode(q, k_cache, v_cache, meta, scale, *scales, **var)
        if n == 0:
            return self.prefill(q, k_cache, v_cache, meta, scale, *scales, **var)
        out = torch.empty_like(q)
        out[:n] = self.decode(q[:n], k_cache, v_cache, meta, scale, *scales, **var)
        out[n:] = self.prefill(q[n:], k_cache, v_cache, meta, scale, *scales, **var)
        return out
