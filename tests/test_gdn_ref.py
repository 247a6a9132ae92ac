"""The Gated DeltaNet reference kernels (engine/kernels/gdn_ref.py) against transformers' own
Qwen3.5 functions, one sequence at a time, on ragged packed batches: decodes (length 1),
sequences shorter than the conv window, longer than the chunk size, fresh and continuing
states, padding slots; and a prefill split across calls equal to one call."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import gdn_ref
from tests.support.gdn_batches import delta_inputs, make_batch

hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

HK, HV, DK, DV, KERNEL, CONV_DIM = 2, 4, 16, 8, 4, 24
NUM_SLOTS = 6
# (length, slot, fresh): decodes first, then prefill chunks: one shorter than K - 1 continuing
# (its slot keeps part of its old conv state), one of 2 fresh, one over two chunks continuing.
SEQS = [(1, 3, False), (1, 0, False), (2, 5, False), (2, 1, True), (5, 2, True), (70, 4, False)]
ATOL = 2e-5


def _batch(seqs=SEQS):
    lengths, slots, fresh = zip(*seqs, strict=True)
    return make_batch(list(lengths), list(slots), list(fresh))


def _hf_delta(inputs, state):
    """transformers' token-by-token rule on one sequence: (o [L, Hv, Dv], final state)."""
    o, final = hf.torch_recurrent_gated_delta_rule(
        *(t[None] for t in (inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta)),
        initial_state=None if state is None else state[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return o[0], final[0]


@pytest.mark.parametrize(
    "rule",
    [
        gdn_ref.gated_delta_rule_varlen,
        gdn_ref.gated_delta_rule_recurrent,
        gdn_ref.gated_delta_rule_chunked,
        lambda *a, **kw: gdn_ref.gated_delta_rule_chunked(*a, **kw, chunk_size=16),
    ],
    ids=["varlen", "recurrent", "chunked64", "chunked16"],
)
def test_delta_rule_matches_transformers(rule):
    gen = torch.Generator().manual_seed(0)
    batch = _batch()
    x = delta_inputs(batch.num_tokens, HK, HV, DK, DV, gen)
    states = torch.randn(NUM_SLOTS, HV, DK, DV, generator=gen) * 0.3
    before = states.clone()
    out = rule(x.q, x.k, x.v, x.g, x.beta, states, batch.query_start_loc, batch.slots, batch.fresh)
    assert out.shape == (batch.num_tokens, HV, DV)
    for i, (_, slot, fresh) in enumerate(SEQS):
        o, final = _hf_delta(x.slice(batch.rows(i)), None if fresh else before[slot])
        torch.testing.assert_close(out[batch.rows(i)], o, atol=ATOL, rtol=0)
        torch.testing.assert_close(states[slot], final, atol=ATOL, rtol=0)


def test_chunked_equals_recurrent_on_long_sequences():
    gen = torch.Generator().manual_seed(1)
    batch = _batch([(130, 0, True), (1, 1, False), (64, 2, False), (65, 3, True)])
    x = delta_inputs(batch.num_tokens, HK, HV, DK, DV, gen)
    states = torch.randn(4, HV, DK, DV, generator=gen) * 0.3
    results = []
    for rule in (gdn_ref.gated_delta_rule_recurrent, gdn_ref.gated_delta_rule_chunked):
        s = states.clone()
        o = rule(x.q, x.k, x.v, x.g, x.beta, s, batch.query_start_loc, batch.slots, batch.fresh)
        results.append((o, s))
    torch.testing.assert_close(results[0][0], results[1][0], atol=ATOL, rtol=0)
    torch.testing.assert_close(results[0][1], results[1][1], atol=ATOL, rtol=0)


def test_delta_rule_prefill_split_across_calls_equals_one_call():
    gen = torch.Generator().manual_seed(2)
    x = delta_inputs(100, HK, HV, DK, DV, gen)
    whole = torch.zeros(2, HV, DK, DV)
    one = make_batch([100], [1], [True])
    expected = gdn_ref.gated_delta_rule_varlen(
        x.q, x.k, x.v, x.g, x.beta, whole, one.query_start_loc, one.slots, one.fresh
    )
    split = torch.full((2, HV, DK, DV), float("nan"))  # a fresh first chunk never reads it
    pieces, start = [], 0
    for n in (3, 66, 1, 30):
        part = x.slice(slice(start, start + n))
        step = make_batch([n], [1], [start == 0])
        pieces.append(
            gdn_ref.gated_delta_rule_varlen(
                part.q,
                part.k,
                part.v,
                part.g,
                part.beta,
                split,
                step.query_start_loc,
                step.slots,
                step.fresh,
            )
        )
        start += n
    torch.testing.assert_close(torch.cat(pieces), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(split[1], whole[1], atol=ATOL, rtol=0)


def test_padding_slot_reads_and_writes_nothing():
    gen = torch.Generator().manual_seed(3)
    batch = make_batch([1, 1], [0, -1], [False, False])
    x = delta_inputs(2, HK, HV, DK, DV, gen)
    states = torch.randn(1, HV, DK, DV, generator=gen)
    expected_o, expected_state = _hf_delta(x.slice(slice(0, 1)), states[0].clone())
    out = gdn_ref.gated_delta_rule_varlen(
        x.q, x.k, x.v, x.g, x.beta, states, batch.query_start_loc, batch.slots, batch.fresh
    )
    torch.testing.assert_close(out[:1], expected_o, atol=ATOL, rtol=0)
    torch.testing.assert_close(states[0], expected_state, atol=ATOL, rtol=0)


def _conv_inputs(num_tokens, gen, bias=True):
    x = torch.randn(num_tokens, CONV_DIM, generator=gen)
    weight = torch.randn(CONV_DIM, KERNEL, generator=gen)
    b = torch.randn(CONV_DIM, generator=gen) if bias else None
    return x, weight, b


@pytest.mark.parametrize("bias", [True, False])
def test_conv1d_matches_transformers(bias):
    gen = torch.Generator().manual_seed(4)
    batch = _batch()
    x, weight, b = _conv_inputs(batch.num_tokens, gen, bias)
    states = torch.randn(NUM_SLOTS, CONV_DIM, KERNEL - 1, generator=gen)
    before = states.clone()
    out = gdn_ref.causal_conv1d_varlen(
        x, weight, b, states, batch.query_start_loc, batch.slots, batch.fresh, "silu"
    )
    for i, (_, slot, fresh) in enumerate(SEQS):
        seq = x[batch.rows(i)].T[None]  # [1, conv_dim, len]
        if fresh:
            expected = hf.causal_conv1d_fn(seq, weight, b, activation="silu")[0].T
            expected_state = torch.cat([torch.zeros(CONV_DIM, KERNEL - 1), seq[0]], dim=1)
            expected_state = expected_state[:, -(KERNEL - 1) :]
        else:
            state = before[slot][None].clone()
            expected = hf.causal_conv1d_update(seq, state, weight, b, "silu")[0].T
            expected_state = state[0]
        torch.testing.assert_close(out[batch.rows(i)], expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(states[slot], expected_state, atol=0, rtol=0)


def test_conv1d_short_sequence_keeps_shifted_old_state():
    old = torch.arange(6.0).view(1, 2, 3)  # one slot, 2 channels, K - 1 = 3 entries
    x = torch.tensor([[10.0, 20.0]])  # one token
    batch = make_batch([1], [0], [False])
    gdn_ref.causal_conv1d_varlen(
        x, torch.ones(2, 4), None, old, batch.query_start_loc, batch.slots, batch.fresh, None
    )
    assert old[0].tolist() == [[1.0, 2.0, 10.0], [4.0, 5.0, 20.0]]


def test_conv1d_prefill_split_across_calls_equals_one_call():
    gen = torch.Generator().manual_seed(5)
    x, weight, b = _conv_inputs(40, gen)
    whole = torch.zeros(1, CONV_DIM, KERNEL - 1)
    one = make_batch([40], [0], [True])
    expected = gdn_ref.causal_conv1d_varlen(
        x, weight, b, whole, one.query_start_loc, one.slots, one.fresh
    )
    split = torch.full_like(whole, float("nan"))
    pieces, start = [], 0
    for n in (2, 1, 30, 7):
        step = make_batch([n], [0], [start == 0])
        pieces.append(
            gdn_ref.causal_conv1d_varlen(
                x[start : start + n], weight, b, split, step.query_start_loc, step.slots, step.fresh
            )
        )
        start += n
    torch.testing.assert_close(torch.cat(pieces), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(split, whole, atol=0, rtol=0)


def test_bad_arguments_say_what_to_change():
    batch = make_batch([2], [0], [True])
    x = torch.randn(2, CONV_DIM)
    with pytest.raises(ValueError, match="conv_states must be"):
        gdn_ref.causal_conv1d_varlen(
            x,
            torch.randn(CONV_DIM, KERNEL),
            None,
            torch.zeros(1, CONV_DIM, KERNEL),
            batch.query_start_loc,
            batch.slots,
            batch.fresh,
        )
    d = delta_inputs(2, HK, HV, DK, DV, torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="float32"):
        gdn_ref.gated_delta_rule_varlen(
            d.q,
            d.k,
            d.v,
            d.g,
            d.beta,
            torch.zeros(1, HV, DK, DV, dtype=torch.bfloat16),
            batch.query_start_loc,
            batch.slots,
            batch.fresh,
        )
    with pytest.raises(ValueError, match="slots and fresh"):
        gdn_ref.gated_delta_rule_varlen(
            d.q,
            d.k,
            d.v,
            d.g,
            d.beta,
            torch.zeros(1, HV, DK, DV),
            batch.query_start_loc,
            torch.zeros(2, dtype=torch.int32),
            batch.fresh,
        )
