"""The adaptive choice of k on synthetic cost tables: on at batch 1 with good acceptance, off
for a compute-bound batch of 64, off for a request whose drafts keep failing (and back later)."""

from __future__ import annotations

import random

import pytest

from engine.spec.draft_length import Acceptance, CostTable, SpecPolicy, expected_tokens

KS = range(0, 9)
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def roofline(batch: int, k: int) -> float:
    """A step reads 16 GB of weights at 4 TB/s (4 ms) or computes 16 GFLOP per token at an
    effective 200 TFLOP/s (80 us a token), whichever is longer, plus 0.3 ms of overhead: at
    batch 64 the step is compute-bound."""
    return max(4e-3, batch * (k + 1) * 80e-6) + 0.3e-3


def table(fn=roofline, batches=BATCHES) -> CostTable:
    return CostTable({(b, k): fn(b, k) for b in batches for k in KS})


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.6, 3) == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    assert expected_tokens(0.9, 0) == 1.0


def _fed(policy: SpecPolicy, ids, rate: float, steps: int = 30, k: int = 4) -> None:
    """Verifications where each draft is accepted with probability `rate` until one fails."""
    rng = random.Random(0)
    for _ in range(steps):
        for r in ids:
            accepted = 0
            while accepted < k and rng.random() < rate:
                accepted += 1
            policy.observe(r, "ngram", k, accepted)


def test_batch_1_with_high_acceptance_drafts():
    policy = SpecPolicy(table())
    _fed(policy, ["a"], 0.8)
    assert policy.request_rate("a") == pytest.approx(0.8, abs=0.1)
    d = policy.choose(["a"], "ngram")
    assert d.k > 0 and d.per_request == [d.k]
    # at a = 0.8 a batch-1 step of 3 to 8 drafts costs the same as without: the gain is E(a, k)
    gain = expected_tokens(policy.request_rate("a"), d.k)
    assert d.tokens_per_s / d.tokens_per_s_off == pytest.approx(gain, 1e-3)
    assert d.tokens_per_s / d.tokens_per_s_off > 3


def test_compute_bound_batch_of_64_turns_speculation_off():
    policy = SpecPolicy(table())
    ids = [f"r{i}" for i in range(64)]
    _fed(policy, ids, 0.8, steps=10)
    d = policy.choose(ids, "ngram")
    assert d.k == 0 and d.per_request == [0] * 64
    assert d.tokens_per_s == d.tokens_per_s_off
    # between the two: batch 8 still drafts, fewer tokens than batch 1 would
    assert 0 < policy.choose(ids[:8], "ngram").k < policy.choose(ids[:1], "ngram").k


def test_sequences_that_cannot_draft_count_in_the_batch():
    """One drafting request beside 63 that cannot draft (grammar, prefill) is costed as a
    batch of 64: compute-bound, so it does not draft; alone it would."""
    policy = SpecPolicy(table())
    _fed(policy, ["a"], 0.8)
    assert policy.choose(["a"], "ngram").k > 0
    d = policy.choose(["a"], "ngram", others=63)
    assert d.k == 0 and d.per_request == [0]
    assert d.tokens_per_s_off == pytest.approx(64 / roofline(64, 0))


def test_low_acceptance_at_batch_1_turns_speculation_off():
    # a verify step that costs 40% more than a decode step needs a > ~0.3 to pay
    policy = SpecPolicy(table(lambda b, k: 1e-3 * (1 + 0.4 * (k > 0) + 0.05 * k)))
    _fed(policy, ["a"], 0.15)
    assert policy.choose(["a"], "ngram").k == 0
    _fed(policy, ["b"], 0.9)
    assert policy.choose(["b"], "ngram").k > 0


def test_failing_request_stops_drafting_then_is_retried():
    policy = SpecPolicy(table(), retry_after=10)
    _fed(policy, ["good"], 0.9, steps=5)
    updates = 0
    while policy.is_drafting("bad"):
        policy.observe("bad", "ngram", 4, 0)
        updates += 1
        assert updates <= 12
    assert updates >= policy.min_updates
    d = policy.choose(["good", "bad"], "ngram")
    assert d.k > 0 and d.per_request == [d.k, 0]
    for _ in range(9):
        policy.choose(["good", "bad"], "ngram")
    assert policy.choose(["good", "bad"], "ngram").per_request[1] > 0  # retried
    policy.release("bad")
    assert policy.is_drafting("bad")


def test_a_drafters_rate_is_the_first_guess_for_its_new_requests():
    costs = table(lambda b, k: 1e-3 * (1 + 0.4 * (k > 0) + 0.05 * k))
    policy = SpecPolicy(costs)
    _fed(policy, ["a", "b"], 0.95, steps=40)  # the drafter does well everywhere
    assert policy.first_guess("ngram") > policy.probe_rate == policy.first_guess("other")
    assert policy.choose(["new"], "ngram").k > policy.choose(["new"], "other").k
    # A drafter that did badly does not keep new requests from trying: they start from the
    # probe rate, draft, and stop once their own verifications say so.
    policy = SpecPolicy(costs)
    _fed(policy, ["a", "b"], 0.05, steps=40)
    assert policy.drafter_rate("ngram") < 0.1
    assert policy.choose(["new"], "ngram").k > 0
    for _ in range(3):
        policy.observe("new", "ngram", 4, 0)
    assert policy.choose(["new"], "ngram").k == 0


def test_draft_cost_and_max_k():
    free = SpecPolicy(table(), max_k=3)
    _fed(free, ["a"], 0.95)
    assert free.choose(["a"], "ngram").k == 3
    slow_drafter = table(lambda b, k: 2e-3 * k)  # a draft model: 2 ms per drafted token
    costly = SpecPolicy(table(), draft_costs=slow_drafter)
    uncapped = SpecPolicy(table())
    for policy in (costly, uncapped):
        _fed(policy, ["a"], 0.7)
        _fed(policy, ["b"], 0.3)
    assert uncapped.choose(["a"], "ngram").k == 8  # the drafts cost nothing: draft the most
    assert 0 < costly.choose(["a"], "ngram").k < 4
    assert uncapped.choose(["b"], "ngram").k > 0
    assert costly.choose(["b"], "ngram").k == 0


def test_cost_table_interpolates_and_extrapolates_upwards():
    costs = CostTable({(1, 0): 1.0, (8, 0): 2.0, (1, 2): 1.5, (8, 2): 4.0})
    assert costs.ks == [0, 2]
    assert costs.cost(1, 0) == 1.0
    assert costs.cost(4, 0) == pytest.approx(1 + 3 / 7)
    assert costs.cost(8, 2) == 4.0
    assert costs.cost(16, 2) == 8.0  # above the largest measured batch: in proportion
    with pytest.raises(KeyError, match="k = 1 was not measured"):
        costs.cost(1, 1)
    with pytest.raises(ValueError, match="no k = 0"):
        CostTable({(1, 1): 1.0})
    with pytest.raises(ValueError, match="seconds >= 0"):
        CostTable({(1, 0): -1.0})
    with pytest.raises(ValueError, match="positive time"):
        SpecPolicy(CostTable({(1, 0): 0.0}))
    with pytest.raises(ValueError, match="empty"):
        CostTable({})


def test_acceptance_counts_checked_drafts():
    acc = Acceptance(decay=0.5, prior=0.5, prior_weight=2)
    acc.update(4, 4)  # all accepted: 4 checked
    acc.update(4, 1)  # one accepted, the second rejected: 2 checked
    assert (acc.accepted, acc.checked) == (0.25 + 0.5 * 4 + 1, 0.5 + 0.5 * 4 + 2)
    acc.update(0, 0)  # nothing drafted: no information
    assert acc.num_updates == 2
    with pytest.raises(ValueError, match="impossible"):
        acc.update(2, 3)
    fresh = Acceptance(decay=0.5, prior=0.6, prior_weight=2)
    assert fresh.rate == pytest.approx(0.6)
    for _ in range(20):
        fresh.update(4, 0)
    assert fresh.rate < 1e-5  # the prior decays away
    with pytest.raises(ValueError, match="decays"):
        SpecPolicy(table(), decay=1.0)


def test_the_policy_table_script_reports_the_choices():
    from benchmarks.spec_policy_table import decisions

    rows = decisions(table(), [0.3, 0.9], [1, 64])
    by = {(a, b): (k, gain) for a, b, k, gain in rows}
    assert by[0.9, 1][0] > 0 and by[0.9, 1][1] > 1.5  # batch 1 reads the weights either way
    assert by[0.3, 64] == (0, 1.0) and by[0.9, 64][0] == 0  # compute-bound: never drafts


def test_a_batch_where_no_k_could_pay_is_answered_without_reading_the_requests(monkeypatch):
    # compute-bound: k + 1 tokens a sequence cost k + 1 times one; at best drafting breaks even
    policy = SpecPolicy(table(lambda b, k: 1e-3 * b * (k + 1)))
    _fed(policy, ["a"], 0.95)
    ids = [f"r{i}" for i in range(64)]
    full = policy.choose(ids, "ngram")
    monkeypatch.setattr(policy, "is_drafting", lambda r: pytest.fail("read a request"))
    short = policy.choose(ids, "ngram")
    assert full.k == short.k == 0 and short.per_request == [0] * 64
    assert short.tokens_per_s == short.tokens_per_s_off == full.tokens_per_s_off
    policy = SpecPolicy(table())
    monkeypatch.setattr(policy, "is_drafting", lambda r: pytest.fail("read a request"))
    with pytest.raises(pytest.fail.Exception):  # where a k may pay, it reads the requests
        policy.choose(["a"], "ngram")
