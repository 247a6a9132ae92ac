"""Qwen3.5's Gated DeltaNet layer (engine/models/gated_deltanet.py) on the Triton kernels it
runs on CUDA (conv1d.py, gdn.py; under Triton's CPU interpreter without CUDA) equals the layer
on the PyTorch reference (gdn_ref.py): the layer hands the kernels its row-strided q/k/v views,
the step's int64 state slots and bool fresh flags, and the pool's views; outputs and the
states written back agree on a batch of decodes (one fresh: a 1-token prompt) and prefill
chunks (fresh and continuing)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import gdn_ref
from engine.models import gated_deltanet
from engine.models.gated_deltanet import GatedDeltaNet
from engine.models.model_config import ModelConfig
from engine.runner.forward_context import AttentionMetadata, forward_context
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules
from tests.test_qwen3_5_config import tiny_text_config

DEVICE = "cuda" if HAS_CUDA else "cpu"

_conv_mod, _gdn_mod = import_kernel_modules(
    [("conv1d", "_conv_kernel"), ("gdn", "_recurrent_kernel")]
)

# (tokens, slot, fresh): two decodes (the second a fresh 1-token prompt), then prefill chunks
SEQS = [(1, 3, False), (1, 0, True), (6, 1, False), (9, 2, True)]


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _meta(device) -> AttentionMetadata:
    lengths = [n for n, _, _ in SEQS]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    as_int = dict(dtype=torch.int32, device=device)
    return AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, **as_int),
        seq_lens=torch.tensor(lengths, **as_int),
        block_tables=torch.zeros(len(SEQS), 1, **as_int),
        num_decodes=2,
        max_query_len=max(lengths),
        max_seq_len=max(lengths),
        query_start_loc_cpu=starts,
        seq_lens_cpu=lengths,
        state_slots=torch.tensor([s for _, s, _ in SEQS], dtype=torch.int64, device=device),
        state_fresh=torch.tensor([f for _, _, f in SEQS], dtype=torch.bool, device=device),
    )


def _run(layer, x, conv_state, recurrent_state, kernels, monkeypatch):
    monkeypatch.setattr(gated_deltanet, "_kernels", lambda device: kernels)
    layer.conv_state, layer.recurrent_state = conv_state.clone(), recurrent_state.clone()
    with torch.no_grad(), forward_context(_meta(x.device)):
        out = layer(x)
    return out, layer.conv_state, layer.recurrent_state


def test_layer_on_the_triton_kernels_equals_the_reference(monkeypatch):
    cfg = ModelConfig.from_dict(tiny_text_config().to_dict())
    s = cfg.linear_attention
    gen = torch.Generator().manual_seed(0)
    layer = GatedDeltaNet(cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    layer = layer.to(DEVICE)
    num_slots, num_tokens = 5, sum(n for n, _, _ in SEQS)
    x = torch.randn(num_tokens, cfg.hidden_size, generator=gen).to(DEVICE)
    conv = torch.randn(num_slots, s.conv_dim, s.conv_kernel - 1, generator=gen).to(DEVICE)
    shape = (num_slots, s.num_value_heads, s.key_head_dim, s.value_head_dim)
    recurrent = (torch.randn(shape, generator=gen) * 0.3).to(DEVICE)
    ref = (gdn_ref.causal_conv1d_varlen, gdn_ref.gated_delta_rule_varlen)
    triton = (_conv_mod.causal_conv1d_varlen, _gdn_mod.gated_delta_rule_varlen)
    want = _run(layer, x, conv, recurrent, ref, monkeypatch)
    got = _run(layer, x, conv, recurrent, triton, monkeypatch)
    for ours, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    # slot 4 belongs to no sequence: untouched; the others were written
    assert torch.equal(got[1][4], conv[4]) and torch.equal(got[2][4], recurrent[4])
    assert not any(torch.equal(got[2][i], recurrent[i]) for i in range(4))
