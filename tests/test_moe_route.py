"""The one-launch MoE routing (engine/kernels/moe_route.py) against the PyTorch rules it
replaces (engine/models/moe_block.py): the same experts in the same order and the same weights, for
each rule, with Gemma 4's per-expert scale, under Triton's CPU interpreter or on a GPU."""

from __future__ import annotations

import pytest
import torch

from engine.models.moe_block import (
    RENORMALIZES,
    pick_experts,
    softmax_topk,
    softmax_topk_renormalized,
    topk_softmax,
)
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

(_route,) = import_kernel_modules([("moe_route", "_route_kernel")])
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("rule", [softmax_topk, softmax_topk_renormalized, topk_softmax])
@pytest.mark.parametrize(
    "tokens,experts,k,dtype",
    [(1, 128, 8, torch.bfloat16), (5, 32, 4, torch.float32), (3, 10, 3, torch.float32)],
)
@pytest.mark.parametrize("scaled", [False, True], ids=["", "expert-scale"])
def test_route_matches_the_pytorch_rule(rule, tokens, experts, k, dtype, scaled):
    gen = torch.Generator().manual_seed(tokens * experts + k)
    # distinct logits: a tie's order is the kernel's own (lowest index first)
    logits = torch.randperm(experts * tokens, generator=gen).view(tokens, experts) / 8
    logits = logits.to(DEVICE, dtype)
    scale = (0.5 + torch.rand(experts, generator=gen)).to(DEVICE) if scaled else None
    weights, ids = _route.route_topk(logits, k, RENORMALIZES[rule], scale)
    want_weights, want_ids = rule(logits, k)
    if scaled:
        want_weights = want_weights * scale[want_ids]
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-7)


def test_ties_pick_the_lowest_index_first_and_bad_calls_are_refused():
    logits = torch.zeros(2, 8, device=DEVICE)
    logits[1, 5] = 1.0
    weights, ids = _route.route_topk(logits, 3, renormalize=True)
    assert ids.tolist() == [[0, 1, 2], [5, 0, 1]]
    assert torch.allclose(weights.sum(-1), torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="k=9 must be between 1 and num_experts=8"):
        _route.route_topk(logits, 9, renormalize=True)
    with pytest.raises(ValueError, match="expert_scale"):
        _route.route_topk(logits, 2, True, torch.ones(7, device=DEVICE))
    assert _route.route_topk(logits[:0], 2, True)[1].shape == (0, 2)


def test_pick_experts_runs_the_rule_in_pytorch_off_cuda():
    """Off CUDA (and for a rule the kernel does not know) the rule itself runs."""
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    weights, ids = pick_experts(logits, 2, softmax_topk, torch.full((16,), 2.0))
    want_weights, want_ids = softmax_topk(logits, 2)
    assert torch.equal(ids, want_ids) and torch.allclose(weights, 2 * want_weights)
