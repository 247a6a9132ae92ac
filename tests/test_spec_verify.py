"""Verification of drafts: greedy and seeded sampling emit exactly the tokens of plain decoding,
drafts equal to the target are always accepted, and rejection sampling keeps the target's
distribution (chi-square on an 8-token vocabulary, with wrong samplers shown to fail)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.runner.input_prep import prepare_sampling
from engine.runner.sampler import (
    SamplingTensors,
    hashed_uniform,
    hashed_uniform_at,
    sample,
    scale_and_filter,
)
from engine.sampling_params import SamplingParams
from engine.scheduling.request import Request
from engine.spec import verify as verify_module
from engine.spec.ngram import NgramDrafter
from engine.spec.verify import ACCEPT_COLUMN, verify

VOCAB = 32
CPU = torch.device("cpu")


class BigramModel:
    """A toy target: the next token's logits depend on the last token and the position."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(VOCAB, VOCAB, generator=g) * 3  # [vocab, vocab]
        self.by_pos = torch.randn(5, VOCAB, generator=g) * 0.5  # [5, vocab]

    def logits(self, tokens: list[int]) -> torch.Tensor:  # [vocab]
        return self.table[tokens[-1]] + self.by_pos[len(tokens) % 5]


def _requests(prompts, params, seeds) -> list[Request]:
    return [Request(f"r{i}", p, params[i], seeds[i]) for i, p in enumerate(prompts)]


def plain_decode(model, prompts, params, seeds) -> list[list[int]]:
    reqs = _requests(prompts, params, seeds)
    while any(not r.is_finished for r in reqs):
        live = [r for r in reqs if not r.is_finished]
        logits = torch.stack([model.logits(r.token_ids) for r in live])  # [live, vocab]
        tokens = sample(logits, prepare_sampling(live, VOCAB, CPU)).token_ids
        for r, tok in zip(live, tokens.tolist()):
            r.append_token(tok)
    return [r.output_token_ids for r in reqs]


def spec_decode(model, prompts, params, seeds, ks, *, random_drafts=False):
    """Decode with drafts verified by `verify`; ks[i] drafts a step for request i."""
    reqs = _requests(prompts, params, seeds)
    drafter = NgramDrafter(min_n=1)
    g = torch.Generator().manual_seed(5)
    accepted = 0
    while any(not r.is_finished for r in reqs):
        live = [i for i, r in enumerate(reqs) if not r.is_finished]
        batch = [reqs[i] for i in live]
        drafts = [d.token_ids for d in drafter.propose(batch, [ks[i] for i in live])]
        if random_drafts:  # drafts that are mostly wrong, of every length up to k
            drafts = [torch.randint(0, VOCAB, (ks[i],), generator=g).tolist() for i in live]
        max_k = max(len(d) for d in drafts)
        padded = torch.tensor([d + [0] * (max_k - len(d)) for d in drafts], dtype=torch.int64)
        padded = padded.view(len(batch), max_k)
        rows = [
            model.logits(r.token_ids + d[:j])
            for r, d in zip(batch, drafts)
            for j in range(len(d) + 1)
        ]
        out = verify(
            torch.stack(rows), padded, [len(d) for d in drafts], prepare_sampling(batch, VOCAB, CPU)
        )
        for r, toks, n in zip(batch, out.token_ids.tolist(), out.num_emitted.tolist()):
            accepted += n - 1
            for tok in toks[:n]:
                if not r.is_finished:
                    r.append_token(tok)
    return [r.output_token_ids for r in reqs], accepted


PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [7, 8, 9, 7, 8], [5] * 6, [10, 11, 12, 13, 14, 10, 11]]


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_equals_plain_argmax_decoding(k):
    model = BigramModel(0)
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)] * len(PROMPTS)
    seeds = [0] * len(PROMPTS)
    want = plain_decode(model, PROMPTS, params, seeds)
    ks = [k, 0, k, max(k - 1, 0)]  # different k per sequence, one without drafts
    got, accepted = spec_decode(model, PROMPTS, params, seeds, ks)
    assert got == want
    assert accepted > 0  # the greedy toy model cycles, so lookups hit
    got_random, _ = spec_decode(model, PROMPTS, params, seeds, ks, random_drafts=True)
    assert got_random == want


@pytest.mark.parametrize("k", [2, 5])
def test_seeded_sampling_with_penalties_equals_plain_decoding_at_any_k(k):
    model = BigramModel(1)
    params = [
        SamplingParams(max_tokens=25, temperature=0.8, top_k=8, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=1.0, top_p=0.9, repetition_penalty=1.3),
        SamplingParams(max_tokens=25, temperature=0.7, frequency_penalty=0.5, min_p=0.05),
        SamplingParams(max_tokens=25, temperature=0.0, presence_penalty=0.4, ignore_eos=True),
    ]
    seeds = [11, 12, 13, 14]
    want = plain_decode(model, PROMPTS, params, seeds)
    got, _ = spec_decode(model, PROMPTS, params, seeds, [k, k, 1, k])
    assert got == want
    again, _ = spec_decode(model, PROMPTS, params, seeds, [k, k, 1, k], random_drafts=True)
    assert again == want
    other = plain_decode(model, PROMPTS, params, [21, 22, 23, 14])
    assert other[:3] != want[:3]  # the seed decides the sampled rows


def _tensors(seeds: torch.Tensor, temperature: float, top_k: int = VOCAB) -> SamplingTensors:
    n = seeds.shape[0]
    return SamplingTensors(
        temperature=torch.full((n,), temperature),
        top_k=torch.full((n,), top_k, dtype=torch.int64),
        top_p=torch.ones(n),
        min_p=torch.zeros(n),
        seeds=seeds,
        steps=torch.full((n,), 3, dtype=torch.int64),
        all_greedy=temperature == 0,
        any_top_k=top_k < VOCAB,
        any_top_p=False,
        any_min_p=False,
        max_logprobs=None,
    )


def test_draft_equal_to_target_is_always_accepted():
    g = torch.Generator().manual_seed(0)
    n, k = 200, 4
    logits = torch.randn(n * (k + 1), VOCAB, generator=g) * 2
    # sampling: q = p, x drawn from q
    t = _tensors(torch.arange(n, dtype=torch.int64), temperature=0.9, top_k=10)
    per_row = _tensors(torch.zeros(n * (k + 1), dtype=torch.int64), temperature=0.9, top_k=10)
    p = scale_and_filter(logits, per_row).softmax(-1).view(n, k + 1, VOCAB)  # the sampler's p
    drafts = torch.multinomial(p[:, :k].reshape(-1, VOCAB), 1, generator=g).view(n, k)
    out = verify(logits, drafts, [k] * n, t, draft_probs=p[:, :k])
    assert out.num_emitted.tolist() == [k + 1] * n
    assert torch.equal(out.token_ids[:, :k], drafts)
    # greedy: the drafts are the argmax
    greedy = logits.view(n, k + 1, VOCAB).argmax(-1)
    for probs in (None, p[:, :k]):
        out = verify(logits, greedy[:, :k], [k] * n, _tensors(t.seeds, 0.0), draft_probs=probs)
        assert out.num_emitted.tolist() == [k + 1] * n
        assert torch.equal(out.token_ids, greedy)


# --- the distribution of emitted tokens ------------------------------------------------------
SMALL = 8
TRIALS = 8_000
P_VALUE_FLOOR = 1e-3
TARGET_LOGITS = torch.tensor([2.0, 1.5, 1.2, 0.8, 0.5, 0.2, -0.5, -1.0])
DRAFT_LOGITS = torch.tensor([-1.0, -0.5, 0.0, 0.5, 0.8, 1.2, 1.5, 2.0])


def _chi_square_p_value(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """P-value of the counts of `tokens` against the distribution p (over p's support)."""
    counts = torch.bincount(tokens, minlength=p.numel()).double()
    support = p > 0
    if (counts[~support] > 0).any():
        return 0.0
    expected = p[support].double() * counts.sum()
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


def _target_p(temperature: float, top_k: int) -> torch.Tensor:
    scaled = TARGET_LOGITS / temperature
    keep = scaled >= scaled.topk(top_k).values[-1]
    return scaled.masked_fill(~keep, float("-inf")).softmax(-1)


def _speculate(temperature: float, top_k: int, k: int, one_hot: bool):
    """TRIALS sequences (seeds 0..TRIALS-1) with the same target rows and k drafts each."""
    q = DRAFT_LOGITS.softmax(-1)
    g = torch.Generator().manual_seed(1)
    if one_hot:
        drafts = torch.full((TRIALS, k), 2, dtype=torch.int64)
        probs = None
    else:
        drafts = torch.multinomial(q, TRIALS * k, replacement=True, generator=g).view(TRIALS, k)
        probs = q.expand(TRIALS, k, SMALL)
    logits = TARGET_LOGITS.expand(TRIALS * (k + 1), SMALL)
    t = _tensors(torch.arange(TRIALS, dtype=torch.int64), temperature, top_k)
    return verify(logits, drafts, [k] * TRIALS, t, draft_probs=probs), drafts


@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, SMALL), (0.7, 5)])
def test_emitted_tokens_follow_the_target_distribution(temperature, top_k, one_hot):
    p = _target_p(temperature, top_k)
    out, drafts = _speculate(temperature, top_k, k=2, one_hot=one_hot)
    assert _chi_square_p_value(out.token_ids[:, 0], p) > P_VALUE_FLOOR
    second = out.token_ids[out.num_emitted >= 2, 1]  # after an accepted draft: p again
    assert second.numel() > 500
    assert _chi_square_p_value(second, p) > P_VALUE_FLOOR
    assert 0.05 < (out.num_emitted > 1).float().mean() < 0.95  # both branches were exercised
    # the test has the power to catch a wrong sampler: accepting every draft emits q
    assert _chi_square_p_value(drafts[:, 0], p) < P_VALUE_FLOOR


def test_wrong_residual_fails_the_chi_square(monkeypatch):
    """Drawing from p instead of norm(max(0, p - q)) after a rejection skews the output."""
    p = _target_p(1.0, SMALL)
    out, _ = _speculate(1.0, SMALL, k=1, one_hot=False)
    assert _chi_square_p_value(out.token_ids[:, 0], p) > P_VALUE_FLOOR
    monkeypatch.setattr(verify_module, "residual", lambda p, q: p)
    wrong, _ = _speculate(1.0, SMALL, k=1, one_hot=False)
    assert _chi_square_p_value(wrong.token_ids[:, 0], p) < P_VALUE_FLOOR


def test_seeded_verification_is_reproducible_and_seed_dependent():
    a, _ = _speculate(0.9, SMALL, k=3, one_hot=False)
    b, _ = _speculate(0.9, SMALL, k=3, one_hot=False)
    assert torch.equal(a.token_ids, b.token_ids)
    # a sequence's result depends on its own seed only, not on the rest of the batch
    g = torch.Generator().manual_seed(1)
    q = DRAFT_LOGITS.softmax(-1)
    drafts = torch.multinomial(q, TRIALS * 3, replacement=True, generator=g).view(TRIALS, 3)
    few = verify(
        TARGET_LOGITS.expand(4 * 4, SMALL),
        drafts[[5, 9, 100, 7]],
        [3] * 4,
        _tensors(torch.tensor([5, 9, 100, 7]), 0.9),
        draft_probs=q.expand(4, 3, SMALL),
    )
    assert torch.equal(few.token_ids, a.token_ids[[5, 9, 100, 7]])


def test_accept_uniform_is_the_sampler_hash_at_an_unused_column():
    seeds = torch.tensor([0, 7, 2**40 + 3])
    steps = torch.tensor([0, 5, 9])
    cols = torch.tensor([[0, 3, 31]])
    assert torch.equal(
        hashed_uniform_at(seeds, steps, cols), hashed_uniform(seeds, steps, 32)[:, [0, 3, 31]]
    )
    u = hashed_uniform_at(seeds, steps, torch.full((3, 1), ACCEPT_COLUMN))
    assert ((u > 0) & (u < 1)).all()


def test_bad_inputs_get_clear_errors():
    t = _tensors(torch.arange(2, dtype=torch.int64), 1.0)
    logits = torch.zeros(5, VOCAB)
    drafts = torch.tensor([[1, 2], [3, 0]])
    with pytest.raises(ValueError, match="need 5"):
        verify(torch.zeros(4, VOCAB), drafts, [2, 1], t)
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        verify(logits, drafts, [3, 0], t)
    with pytest.raises(ValueError, match="vocabulary"):
        verify(logits, torch.tensor([[1, VOCAB], [3, 0]]), [2, 1], t)
    with pytest.raises(ValueError, match="draft_probs"):
        verify(logits, drafts, [2, 1], t, draft_probs=torch.zeros(2, 2, VOCAB + 1))
    assert math.isfinite(float(verify(logits, drafts, [2, 1], t).num_emitted.sum()))


def test_mixed_draft_counts_logprobs_and_both_paths_agree_on_greedy_rows():
    g = torch.Generator().manual_seed(3)
    ks = [0, 3, 1, 2]
    logits = torch.randn(sum(ks) + len(ks), VOCAB, generator=g) * 2
    drafts = torch.randint(0, VOCAB, (len(ks), 3), generator=g)
    drafts[1, 0] = logits[1].argmax()  # sequence 1's first draft is right
    t = _tensors(torch.arange(len(ks), dtype=torch.int64), temperature=0.0)
    t.max_logprobs = 2
    one_hot = verify(logits, drafts, ks, t)
    q = torch.rand(len(ks), 3, VOCAB, generator=g).softmax(-1)
    with_q = verify(logits, drafts, ks, t, draft_probs=q)
    for out in (one_hot, with_q):
        assert out.num_emitted[0] == 1 and out.num_emitted[1] >= 2
        assert torch.equal(out.token_ids, one_hot.token_ids)
        starts = [0, 1, 5, 7]
        raw = logits.log_softmax(-1)
        for i, (start, n) in enumerate(zip(starts, out.num_emitted.tolist())):
            rows = raw[start : start + n]  # the rows the emitted tokens were sampled from
            ids = out.token_ids[i, :n]
            assert torch.equal(ids, rows.argmax(-1))
            assert torch.allclose(out.logprobs[i, :n], rows.gather(-1, ids[:, None]).squeeze(-1))
            assert torch.equal(out.top_ids[i, :n], rows.topk(2).indices)
