"""Attention backends: one interface, a pure-PyTorch implementation (CPU, the reference:
engine/runner/attention_torch.py) and a Triton one (CUDA: engine/runner/attention_triton.py);
select_backend picks one for a device. The model's attention layer calls `store_kv` then
`attention`.

With an int8 KV cache every method also takes `k_scales` / `v_scales`, the per-token, per-head
scale views beside the caches (layout in engine/kernels/torch_ref.py); None otherwise.

A layer's attention variant comes as keyword arguments: `window`, `softcap`, `sinks` (their
meaning in engine/kernels/torch_ref.py); None: plain causal attention."""

from __future__ import annotations

import torch

from engine.runner.attention_torch import AttentionBackend


def select_backend(device: torch.device) -> AttentionBackend:
    """Triton kernels on CUDA when available, else the PyTorch path."""
    if device.type == "cuda":
        try:
            from engine.runner.attention_triton import TritonBackend
        except ImportError:
            return AttentionBackend()
        return TritonBackend()
    return AttentionBackend()
