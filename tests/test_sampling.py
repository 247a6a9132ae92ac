"""Sampling: seeds are reproducible whatever the batch, filters and penalties do what they say."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.runner.sampler import (
    SamplingTensors,
    apply_penalties,
    hashed_uniform,
    hashed_uniform_at,
    sample,
)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), device="cpu", max_num_batched_tokens=64)


PROMPT = list(range(40, 60))


def _seeded(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True)


def test_same_seed_same_tokens_alone_and_in_busy_batch(llm):
    alone = llm.generate([PROMPT], _seeded(7))[0].token_ids
    again = llm.generate([PROMPT], _seeded(7))[0].token_ids
    assert alone == again
    g = torch.Generator().manual_seed(3)
    others = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 50, 90, 13)]
    busy = llm.generate(
        others[:2] + [PROMPT] + others[2:],
        [SamplingParams(max_tokens=30, temperature=0.8, ignore_eos=True)] * 2
        + [_seeded(7)]
        + [SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)] * 2,
    )
    assert busy[2].token_ids == alone


def test_same_seed_survives_preemption(tiny_llama):
    small = LLM(
        str(tiny_llama),
        device="cpu",
        num_kv_blocks=8,
        max_num_batched_tokens=32,
        max_model_len=128,
        max_num_seqs=4,
    )
    prompts = [PROMPT, list(range(1, 70)), list(range(100, 160))]
    outs = small.generate(prompts, _seeded(11))
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    big = LLM(str(tiny_llama), device="cpu")
    assert [o.token_ids for o in big.generate(prompts, _seeded(11))] == [o.token_ids for o in outs]


def test_different_seeds_differ(llm):
    outs = llm.generate([PROMPT] * 4, [_seeded(s) for s in (1, 2, 3, 4)])
    assert len({tuple(o.token_ids) for o in outs}) == 4


def test_unseeded_requests_differ_from_each_other(llm):
    outs = llm.generate(
        [PROMPT] * 3, SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True)
    )
    assert len({tuple(o.token_ids) for o in outs}) == 3


def _tensors(n: int, vocab: int, **kw) -> SamplingTensors:
    base = dict(
        temperature=torch.ones(n),
        top_k=torch.full((n,), vocab),
        top_p=torch.ones(n),
        min_p=torch.zeros(n),
        seeds=torch.arange(n),
        steps=torch.zeros(n, dtype=torch.int64),
        all_greedy=False,
        any_top_k=False,
        any_top_p=False,
        any_min_p=False,
        max_logprobs=None,
    )
    base.update(kw)
    return SamplingTensors(**base)


def test_sampling_frequencies_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    t = _tensors(4000, 4)
    t.seeds = torch.arange(4000) * 7919
    counts = torch.bincount(sample(logits, t).token_ids, minlength=4).float() / 4000
    assert torch.allclose(counts, probs, atol=0.03), counts


def test_uniforms_are_in_range_and_not_repeated():
    u = hashed_uniform(torch.tensor([0, 1, 2**40]), torch.tensor([0, 5, 9]), 1000)
    assert (u > 0).all() and (u < 1).all()
    assert (u[0] != u[1]).float().mean() > 0.99 and abs(u.mean().item() - 0.5) < 0.03


def test_the_top_uniform_stays_below_one_so_masked_tokens_are_never_drawn():
    # (seed 85, index 12, token 100) hashes to the top 24-bit value, whose (bits + 0.5) / 2**24
    # rounds to 1.0 in fp32: the Gumbel noise was inf there and a grammar-masked token (-inf)
    # became NaN and won the argmax (the structured-output fuzz test found it)
    u = hashed_uniform_at(torch.tensor([85]), torch.tensor([12]), torch.tensor([[100]]))
    assert u.item() < 1.0
    logits = torch.zeros(1, 128)
    logits[0, 100] = float("-inf")
    t = _tensors(1, 128)
    t.seeds, t.steps = torch.tensor([85]), torch.tensor([12])
    t.temperature = torch.tensor([0.7])
    t.all_greedy = False
    assert sample(logits, t).token_ids.item() != 100


def test_top_k_top_p_min_p_restrict_the_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(500, 1)
    for kw, allowed in [
        (dict(top_k=torch.full((500,), 2), any_top_k=True), {0, 1}),
        (dict(top_p=torch.full((500,), 0.7), any_top_p=True), {0, 1}),
        (dict(min_p=torch.full((500,), 0.3), any_min_p=True), {0, 1}),
    ]:
        t = _tensors(500, 5, **kw)
        t.seeds = torch.arange(500) * 31 + 5
        drawn = set(sample(logits.clone(), t).token_ids.tolist())
        assert drawn == allowed, (kw, drawn)


def test_penalties():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    t = _tensors(
        1,
        4,
        repetition=torch.tensor([2.0]),
        presence=torch.tensor([0.5]),
        frequency=torch.tensor([0.25]),
        output_counts=torch.tensor([[0.0, 0.0, 3.0, 0.0]]),
        seen_mask=torch.tensor([[True, True, True, False]]),
    )
    out = apply_penalties(logits, t)
    # repetition: 2 -> 1, -2 -> -4, 1 -> 0.5; then token 2 (3 times): 0.5 - 0.75 - 0.5
    assert torch.allclose(out, torch.tensor([[1.0, -4.0, -0.75, 0.5]]))


def test_greedy_and_logprobs(llm):
    out = llm.generate(
        [PROMPT], SamplingParams(max_tokens=5, temperature=0.0, logprobs=3, ignore_eos=True)
    )[0]
    assert len(out.logprobs) == 5
    for token, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == token and len(lp.top) == 3
        assert lp.top[0][0] == token and lp.top[0][1] == pytest.approx(lp.logprob)
        assert lp.logprob <= 0


def test_stop_token_ids_and_max_tokens(llm):
    free = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[
        0
    ]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop_at = free.token_ids[4]
    first = free.token_ids.index(stop_at)
    out = llm.generate(
        [PROMPT],
        SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_at], ignore_eos=True),
    )[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    assert out.token_ids == free.token_ids[: first + 1]
