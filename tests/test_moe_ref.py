"""The PyTorch MoE reference against a loop over tokens and their chosen experts, with every
activation, biases, experts that get no token and a token routed twice to one expert's rank."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.moe_ref import ACTIVATIONS, act_and_mul, fused_moe_ref


def _per_token(x, w13, w2, weights, ids, activation, b13, b2):
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = x[t].double() @ w13[e].double().T + (b13[e].double() if b13 is not None else 0)
            y = act_and_mul(h[None], activation)[0] @ w2[e].double().T
            y = y + (b2[e].double() if b2 is not None else 0)
            out[t] += float(weights[t, j]) * y
    return out


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_fused_moe_ref_matches_a_per_token_loop(activation, bias):
    gen = torch.Generator().manual_seed(len(activation) + bias)
    tokens, hidden, inter, experts, k = 9, 16, 12, 6, 2
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.3
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.3
    b13 = torch.randn(experts, 2 * inter, generator=gen) if bias else None
    b2 = torch.randn(experts, hidden, generator=gen) if bias else None
    ids = torch.randint(0, experts - 2, (tokens, k), generator=gen)  # the last two get none
    weights = F.softmax(torch.randn(tokens, k, generator=gen), dim=-1)
    out = fused_moe_ref(x, w13, w2, weights, ids, activation, b13, b2)
    want = _per_token(x, w13, w2, weights, ids, activation, b13, b2)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="known: silu"):
        act_and_mul(torch.zeros(1, 4), "relu2")
