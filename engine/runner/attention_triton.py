"""The Triton attention backend (CUDA): the AttentionBackend interface over the kernels in
engine/kernels/. A layer's variant (`window`, `softcap`, `sinks`) goes to both kernels as it
is. The kernels are called through their modules, so a test that reloads a kernel module
under Triton's CPU interpreter reaches this backend too."""

from __future__ import annotations

import torch

from engine.kernels import decode_attention as decode_kernels
from engine.kernels import prefill_attention as prefill_kernels
from engine.kernels import store_kv as store_kernels
from engine.runner.attention_torch import AttentionBackend
from engine.runner.forward_context import AttentionMetadata


class TritonBackend(AttentionBackend):
    name = "triton"

    def __init__(self) -> None:
        self._workspaces: dict[tuple, torch.Tensor] = {}

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None) -> None:
        store_kernels.store_kv(k, v, k_cache, v_cache, slot_mapping, k_scales, v_scales)

    def _workspace(self, q: torch.Tensor, num_splits: int) -> torch.Tensor | None:
        """A persistent split-K workspace (fixed addresses, as CUDA-graph replay needs)."""
        if num_splits <= 1:
            return None
        num_seqs, num_heads, head_dim = q.shape
        key = (num_heads, head_dim, num_splits, q.device)
        ws = self._workspaces.get(key)
        if ws is None or ws.shape[0] < num_seqs:
            ws = decode_kernels.decode_workspace(
                max(num_seqs, 256), num_heads, head_dim, num_splits, q.device
            )
            self._workspaces[key] = ws
        return ws

    def decode(
        self,
        q,
        k_cache,
        v_cache,
        meta: AttentionMetadata,
        scale,
        k_scales,
        v_scales,
        out=None,
        **var,
    ):
        n = meta.num_decodes
        splits = meta.decode_num_splits
        return decode_kernels.decode_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables[:n],
            meta.seq_lens[:n],
            scale,
            num_splits=splits,
            max_seq_len=meta.max_seq_len,
            workspace=self._workspace(q, splits) if splits else None,
            out=out,
            k_scales=k_scales,
            v_scales=v_scales,
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
        out = torch.empty_like(q)
        scales = (k_scales, v_scales)
        if n:
            self.decode(q[:n], k_cache, v_cache, meta, scale, *scales, out=out[:n], **var)
        if n < meta.num_seqs:
            prefill_kernels.prefill_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables[n:],
                meta.query_start_loc[n:],
                meta.seq_lens[n:],
                meta.max_query_len,
                scale,
                out=out,
                k_scales=k_scales,
                v_scales=v_scales,
                **var,
            )
        return out
