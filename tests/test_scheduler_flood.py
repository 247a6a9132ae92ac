"""A flood of long prompts from a batch client does not hold back an interactive client's short
request: it is prefilled whole in the step after it arrives, and that step holds at most 1.5x
the tokens it holds alone (the flood's chunk is capped at long_prompt_share of the budget).
Counted in scheduled tokens, not timed: a step's cost grows with its tokens, so the count bounds
the interactive client's time to first token on any machine."""

from __future__ import annotations

import random

import pytest

from engine.llm import LLM
from engine.sampling_params import SamplingParams
from tests.support.tiny_models import VOCAB

BUDGET = 128
"""The step's token budget."""
SHARE = 0.25
"""long_prompt_share: the flood's chunks take at most 32 tokens of a step while a short one
waits, so an interactive request's step holds at most 64 + 32 tokens against its 64 alone."""
SHORT, LONG = 64, 512
"""Prompt lengths of the interactive client and of the batch client; long_prompt_tokens = 128
tells them apart."""
ROUNDS = 3
"""Interactive requests sent alone and under a fresh flood, alternating."""


@pytest.fixture(scope="module")
def engine(tiny_llama):
    # Aging is off (tests/test_scheduler_fairness.py tests it): only the policy under test
    # orders the waiting requests.
    llm = LLM(
        str(tiny_llama),
        device="cpu",
        max_model_len=LONG + 16,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=8,
        long_prompt_share=SHARE,
        long_prompt_tokens=2 * SHORT,
        queue_aging_s=3600.0,
    )
    return llm.engine


@pytest.fixture
def steps(engine, monkeypatch) -> list[dict[str, int]]:
    """Each scheduled step as {request id: tokens scheduled}, in order."""
    seen: list[dict[str, int]] = []
    schedule = engine.scheduler.schedule

    def record():
        batch = schedule()
        seen.append({r.request_id: n for r, n in zip(batch.requests, batch.num_new_tokens)})
        return batch

    monkeypatch.setattr(engine.scheduler, "schedule", record)
    return seen


def _first_token(engine, steps: list[dict[str, int]], name: str, prompt: list[int]) -> dict:
    """Send an interactive request and step the engine until its first token; the one step
    that scheduled it (the first after it arrived)."""
    engine.add_request(name, prompt, SamplingParams(max_tokens=1, client="alice"))
    start = len(steps)
    for _ in range(1000):
        if any(out.request_id == name and out.finished for out in engine.step()):
            scheduled = [step for step in steps[start:] if name in step]
            assert scheduled == [steps[start]], f"{name}: not all in the step after it arrived"
            return steps[start]
    raise AssertionError(f"{name} got no token in 1000 steps")


def test_a_batch_flood_of_long_prompts_does_not_hold_back_an_interactive_request(engine, steps):
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:  # fresh token ids: no prefix-cache hits between requests
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    batch = SamplingParams(max_tokens=1, priority="batch", client="bulk")
    for i in range(ROUNDS):
        alone = _first_token(engine, steps, f"alone{i}", prompt(SHORT))
        assert alone == {f"alone{i}": SHORT}
        flood = [f"flood{i}-{k}" for k in range(3)]
        for name in flood:
            engine.add_request(name, prompt(LONG), batch)
        engine.step()  # the flood runs: a long prompt mid-prefill, two more waiting
        assert sum(steps[-1].values()) == BUDGET  # alone, the flood fills the step
        flooded = _first_token(engine, steps, f"flooded{i}", prompt(SHORT))
        # prefilled whole in the step after it arrives, beside at most SHARE of the budget
        assert flooded[f"flooded{i}"] == SHORT
        assert sum(flooded.values()) <= SHORT + SHARE * BUDGET, flooded
        assert set(flooded) - {f"flooded{i}"} <= set(flood)
        assert engine.scheduler.num_unfinished > 0  # the flood was still there
        for name in flood:
            engine.abort(name)
        while engine.has_unfinished():
            engine.step()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
