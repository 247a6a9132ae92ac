"""Each family's MoE routing rule against a per-token loop written from its definition, and the
MoE block against a per-token loop of dense experts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from engine.models.moe_block import MoEBlock, softmax_topk, softmax_topk_renormalized, topk_softmax


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


def _loop_softmax_topk(logits, k, renormalize):
    """Per token: probabilities over every expert, the k largest, optionally rescaled."""
    weights, ids = [], []
    for row in logits.double().tolist():
        probs = _softmax(row)
        chosen = sorted(range(len(row)), key=lambda e: -probs[e])[:k]
        total = sum(probs[e] for e in chosen) if renormalize else 1.0
        weights.append([probs[e] / total for e in chosen])
        ids.append(chosen)
    return torch.tensor(weights, dtype=torch.float64), torch.tensor(ids)


def _loop_topk_softmax(logits, k):
    """Per token: the k largest logits, then a softmax over those."""
    weights, ids = [], []
    for row in logits.double().tolist():
        chosen = sorted(range(len(row)), key=lambda e: -row[e])[:k]
        weights.append(_softmax([row[e] for e in chosen]))
        ids.append(chosen)
    return torch.tensor(weights, dtype=torch.float64), torch.tensor(ids)


RULES = {
    "softmax_topk": (softmax_topk, lambda x, k: _loop_softmax_topk(x, k, False)),
    "softmax_topk_renormalized": (
        softmax_topk_renormalized,
        lambda x, k: _loop_softmax_topk(x, k, True),
    ),
    "topk_softmax": (topk_softmax, _loop_topk_softmax),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("experts,k", [(8, 2), (128, 8), (32, 4), (4, 4)])
def test_routing_rule_matches_a_per_token_loop(rule, experts, k, dtype):
    fn, loop = RULES[rule]
    gen = torch.Generator().manual_seed(experts * 10 + k)
    # distinct logits (no ties): a random permutation of evenly spaced values per token
    logits = torch.stack([torch.randperm(experts, generator=gen) for _ in range(13)]).float()
    logits = (logits * 0.25 + torch.randn(13, 1, generator=gen)).to(dtype)
    weights, ids = fn(logits, k)
    want_weights, want_ids = loop(logits, k)
    assert weights.dtype == torch.float32 and weights.shape == ids.shape == (13, k)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights.double(), want_weights, rtol=1e-6, atol=1e-6)


def test_the_rules_differ_where_they_should():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    plain, _ = softmax_topk(logits, 2)
    renormalized, _ = softmax_topk_renormalized(logits, 2)
    oai, _ = topk_softmax(logits, 2)
    assert plain.sum() < 0.99
    torch.testing.assert_close(renormalized.sum(), torch.tensor(1.0))
    torch.testing.assert_close(oai, renormalized)


def _dense_expert_loop(block: MoEBlock, x: torch.Tensor, renormalize: bool) -> torch.Tensor:
    """Per token: route from the router's logits (the loop above), then each chosen expert as a
    dense gated MLP (gate rows first), weighted, in float64."""
    inter = block.intermediate_size
    logits = F.linear(x, block.gate.weight, block.gate.bias)
    weights, ids = _loop_softmax_topk(logits, block.top_k, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(block.top_k):
            e = int(ids[t, j])
            w13, w2 = block.w_gate_up[e].double(), block.w_down[e].double()
            b13 = block.b_gate_up[e].double() if block.b_gate_up is not None else 0
            b2 = block.b_down[e].double() if block.b_down is not None else 0
            h = w13 @ x[t].double() + b13
            y = w2 @ (F.silu(h[:inter]) * h[inter:]) + b2
            out[t] += float(weights[t, j]) * y
    return out


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_moe_block_matches_dense_experts_per_token(renormalize, bias):
    gen = torch.Generator().manual_seed(3 + renormalize + 2 * bias)
    hidden, inter, experts, k = 16, 12, 8, 2
    rule = softmax_topk_renormalized if renormalize else softmax_topk
    block = MoEBlock(hidden, inter, experts, k, rule, router_bias=bias, expert_bias=bias)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x = torch.randn(11, hidden, generator=gen)
    with torch.no_grad():
        out = block(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    want = _dense_expert_loop(block, x, renormalize)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)  # fp32 against fp64


def test_bad_block_shapes_are_refused():
    with pytest.raises(ValueError, match="num_experts_per_tok=9"):
        MoEBlock(16, 8, 8, 9, softmax_topk)
    with pytest.raises(ValueError, match="known: silu"):
        MoEBlock(16, 8, 8, 2, softmax_topk, activation="relu")
