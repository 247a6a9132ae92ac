"""A flood of long prompts from a batch client does not raise an interactive client's TTFT p50
by more than 2x: the embedded model on the CPU, one engine, the interactive client's short
requests timed alone and then behind a flood of long batch-class prompts that keeps coming."""

from __future__ import annotations

import random
import statistics

import pytest

from engine.llm import LLM
from engine.sampling_params import SamplingParams

BUDGET = 128
"""The step's token budget: long prompts take at most half of it while a short one waits."""
SHORT, LONG = 48, 512
"""Prompt lengths of the interactive client and of the batch client."""
ROUNDS = 5
"""Interactive requests timed alone, and again under the flood (p50 of each)."""


@pytest.fixture(scope="module")
def engine():
    # Aging is off for this bounded run (tests/test_scheduler_fairness.py tests it): on a
    # loaded CPU a step can take seconds, and flood requests aged past 30 s would rank first.
    llm = LLM(
        device="cpu",
        max_model_len=LONG + 16,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=8,
        queue_aging_s=3600.0,
    )
    return llm.engine


def _ttft(engine, name: str, prompt: list[int]) -> tuple[float, int]:
    """Send an interactive request and step the engine until its first token: its TTFT (s) and
    the steps it took."""
    engine.add_request(name, prompt, SamplingParams(max_tokens=1, client="alice"))
    for steps in range(1, 1000):
        for out in engine.step():
            if out.request_id == name and out.finished:
                return out.metrics.first_token_time - out.metrics.arrival_time, steps
    raise AssertionError(f"{name} got no token in 1000 steps")


def test_a_batch_flood_of_long_prompts_does_not_double_interactive_ttft(engine):
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:  # fresh token ids: no prefix-cache hits between requests
        return [rng.randrange(100, 40_000) for _ in range(n)]

    alone, alone_steps = zip(*(_ttft(engine, f"alone{i}", prompt(SHORT)) for i in range(ROUNDS)))
    batch = SamplingParams(max_tokens=1, priority="batch", client="bulk")
    flood = [f"flood{i}" for i in range(3 + ROUNDS)]
    for name in flood[:3]:
        engine.add_request(name, prompt(LONG), batch)
    engine.step()
    engine.step()  # the flood is running: a long prompt mid-prefill, more waiting
    flooded, flooded_steps = [], []
    for i in range(ROUNDS):
        engine.add_request(flood[3 + i], prompt(LONG), batch)  # the flood keeps coming
        ttft, steps = _ttft(engine, f"flooded{i}", prompt(SHORT))
        flooded.append(ttft)
        flooded_steps.append(steps)
    assert engine.scheduler.num_unfinished > 0  # the flood was still there at the last round
    for name in flood:
        engine.abort(name)
    while engine.has_unfinished():
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    # each interactive request is prefilled in the step after it arrives, beside a chunk of
    # at most BUDGET / 2 of the flood's tokens, as when it is alone
    assert list(flooded_steps) == list(alone_steps) == [1] * ROUNDS
    p50_alone, p50_flooded = statistics.median(alone), statistics.median(flooded)
    assert p50_flooded <= 2 * p50_alone, (
        f"interactive TTFT p50 {p50_flooded * 1e3:.0f} ms under the flood, "
        f"{p50_alone * 1e3:.0f} ms alone (more than 2x)"
    )
