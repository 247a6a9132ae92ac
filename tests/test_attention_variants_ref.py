"""The PyTorch reference's attention variants (sliding window, soft-cap, sinks) against a
float64 loop over each query written from their definitions, on paged caches with a cached
prefix; and the variant path equals the plain path when no variant changes anything."""

from __future__ import annotations

import math

import pytest
import torch

from engine.kernels.torch_ref import decode_attention_ref, prefill_attention_ref
from tests.support.paged_kv import paged_tables

BLOCK = 8


def _paged(seq_lens, num_kv_heads, head_dim, gen):
    num_blocks, tables, slots = paged_tables(seq_lens, BLOCK, gen, spare=2)
    shape = (num_blocks, BLOCK, num_kv_heads, head_dim)
    k_cache, v_cache = torch.zeros(shape), torch.zeros(shape)
    total = sum(seq_lens)
    k = torch.randn(total, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(total, num_kv_heads, head_dim, generator=gen)
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = k
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = v
    return k_cache, v_cache, tables, k, v


def _loop(q, k, v, q_pos, scale, window, softcap, sinks):
    """One query at a time, one head at a time, in float64."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for t, p in enumerate(q_pos):
        for h in range(q.shape[1]):
            keys = [j for j in range(p + 1) if window is None or j > p - window]
            logits = [float(q[t, h].double() @ k[j, h // group].double()) * scale for j in keys]
            if softcap is not None:
                logits = [softcap * math.tanh(x / softcap) for x in logits]
            top = max(logits + ([float(sinks[h])] if sinks is not None else []))
            weights = [math.exp(x - top) for x in logits]
            denom = sum(weights) + (math.exp(float(sinks[h]) - top) if sinks is not None else 0)
            for w, j in zip(weights, keys, strict=True):
                out[t, h] += (w / denom) * v[j, h // group].double()
    return out


VARIANTS = [
    {"window": 5},
    {"softcap": 2.0},
    {"sinks": True},
    {"window": 3, "softcap": 1.5, "sinks": True},
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_variants_match_their_definition(variant):
    gen = torch.Generator().manual_seed(len(str(variant)))
    num_heads, num_kv_heads, head_dim = 4, 2, 16
    chunks = [(6, 6), (4, 19), (1, 11)]  # (q_len, seq_len): a prefix of seq_len - q_len cached
    seq_lens = [s for _, s in chunks]
    k_cache, v_cache, tables, k, v = _paged(seq_lens, num_kv_heads, head_dim, gen)
    starts = [0]
    for q_len, _ in chunks:
        starts.append(starts[-1] + q_len)
    q = torch.randn(starts[-1], num_heads, head_dim, generator=gen)
    sinks = torch.randn(num_heads, generator=gen) if variant.get("sinks") else None
    kw = {"window": variant.get("window"), "softcap": variant.get("softcap"), "sinks": sinks}
    scale = head_dim**-0.5
    out = prefill_attention_ref(q, k_cache, v_cache, tables, starts, seq_lens, scale, **kw)
    offset = 0
    for i, (q_len, seq_len) in enumerate(chunks):
        ks, vs = k[offset : offset + seq_len], v[offset : offset + seq_len]
        q_pos = list(range(seq_len - q_len, seq_len))
        want = _loop(q[starts[i] : starts[i + 1]], ks, vs, q_pos, scale, **kw)
        torch.testing.assert_close(
            out[starts[i] : starts[i + 1]].double(), want, rtol=1e-5, atol=1e-5
        )
        offset += seq_len


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_variants_match_their_definition(variant):
    gen = torch.Generator().manual_seed(7 + len(str(variant)))
    num_heads, num_kv_heads, head_dim = 4, 1, 8
    seq_lens = [1, 9, 17]
    k_cache, v_cache, tables, k, v = _paged(seq_lens, num_kv_heads, head_dim, gen)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen)
    sinks = torch.randn(num_heads, generator=gen) if variant.get("sinks") else None
    kw = {"window": variant.get("window"), "softcap": variant.get("softcap"), "sinks": sinks}
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.3, **kw)
    offset = 0
    for i, n in enumerate(seq_lens):
        want = _loop(
            q[i : i + 1], k[offset : offset + n], v[offset : offset + n], [n - 1], 0.3, **kw
        )
        torch.testing.assert_close(out[i : i + 1].double(), want, rtol=1e-5, atol=1e-5)
        offset += n


def test_a_window_past_every_length_changes_nothing():
    gen = torch.Generator().manual_seed(3)
    seq_lens = [5, 12]
    k_cache, v_cache, tables, _, _ = _paged(seq_lens, 2, 16, gen)
    q = torch.randn(2, 4, 16, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    plain = decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.25)
    wide = decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.25, window=64)
    torch.testing.assert_close(wide, plain)
