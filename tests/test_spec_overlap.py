"""Speculative decoding with overlapped steps (on by default on a GPU; switched on here for the
CPU engine, as tests/test_overlap.py does): a step where nobody drafts stays overlapped (its
input tokens come from the step in flight, on the device), a step that drafts first reads the
step in flight back; outputs are those of the plain loop either way."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.runner.input_prep import PendingFill
from engine.spec.draft_length import CostTable
from engine.spec.measure import MAX_SPECULATIVE_TOKENS

GREEDY = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
MIXED = [
    GREEDY,
    SamplingParams(max_tokens=25, temperature=0.8, seed=3, ignore_eos=True),
    SamplingParams(max_tokens=20, temperature=0.0, logprobs=2),
    SamplingParams(max_tokens=28, temperature=1.0, top_k=5, seed=4, ignore_eos=True),
]


def _prompts() -> list[list[int]]:
    """Prompts repeating a random segment, so the n-gram drafter finds matches."""
    g = torch.Generator().manual_seed(1)
    segments = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 9, 13, 21)]
    return [seg * reps for seg, reps in zip(segments, (6, 4, 3, 2))]


def _table(per_k: float) -> CostTable:
    """A step costs 1 ms plus per_k ms a drafted token: 0 pays to draft, 1 never does."""
    ks = range(MAX_SPECULATIVE_TOKENS + 1)
    return CostTable({(b, k): 1e-3 * (1 + per_k * k) for b in (1, 4) for k in ks})


def _overlapped(folder, **config) -> LLM:
    llm = LLM(str(folder), device="cpu", **config)
    llm.engine._overlap = True
    return llm


@pytest.fixture(scope="module")
def plain(tiny_llama):
    return LLM(str(tiny_llama), device="cpu").generate(_prompts(), MIXED)


def _same(outs, plain) -> None:
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in plain]


@pytest.fixture
def fills(monkeypatch) -> list:
    """One entry per step that took its input tokens from the step in flight."""
    seen = []
    apply = PendingFill.apply
    monkeypatch.setattr(PendingFill, "apply", lambda *a: seen.append(1) or apply(*a))
    return seen


@pytest.mark.parametrize("speculative", ["ngram", "draft"])
def test_pinned_k_drafts_every_step_and_matches_the_plain_loop(
    tiny_llama, plain, fills, speculative
):
    mode = "ngram" if speculative == "ngram" else f"draft:{tiny_llama}"
    llm = _overlapped(tiny_llama, speculative=mode, num_speculative_tokens=3)
    outs = llm.generate(_prompts(), MIXED)
    _same(outs, plain)
    assert llm.engine.spec.counters.num_accepted_tokens > 0
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_where_drafting_does_not_pay_the_steps_stay_overlapped(tiny_llama, plain, fills):
    llm = _overlapped(tiny_llama, speculative="ngram")
    llm.engine.spec.use_costs(_table(per_k=1.0))
    outs = llm.generate(_prompts(), MIXED)
    _same(outs, plain)
    assert llm.engine.spec.counters.num_drafts == 0
    assert len(fills) > 20  # decode steps launched behind the step in flight


def test_adaptive_drafting_beside_overlapped_steps(tiny_llama, plain, fills):
    """Where drafting pays, the policy drafts; a step whose n-gram lookups find nothing is a
    plain step and the next one reads it back before drafting."""
    llm = _overlapped(tiny_llama, speculative="ngram")
    llm.engine.spec.use_costs(_table(per_k=0.0))
    outs = llm.generate(_prompts(), MIXED)
    _same(outs, plain)
    c = llm.engine.spec.counters
    assert 0 < c.num_accepted_tokens < c.num_draft_tokens
