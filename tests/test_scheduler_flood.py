"""A flood of long prompts from a batch client does not raise an interactive client's TTFT p50
by more than 2x: the embedded model on the CPU, one engine, the interactive client's short
requests timed alone and beside a flood of long batch-class prompts, in alternating rounds."""

from __future__ import annotations

import random
import statistics

import pytest

from engine.llm import LLM
from engine.sampling_params import SamplingParams

BUDGET = 128
"""The step's token budget."""
SHARE = 0.25
"""long_prompt_share: the flood's chunks take at most 32 tokens of a step while a short one
waits, so an interactive request's step holds at most 64 + 32 tokens against its 64 alone:
at most 1.5x at a per-token cost (a loaded CPU), about 1x where the step's fixed cost rules."""
SHORT, LONG = 64, 512
"""Prompt lengths of the interactive client and of the batch client; long_prompt_tokens = 128
tells them apart."""
ROUNDS = 5
"""Interactive requests timed alone and under the flood (p50 of each), alternating."""


@pytest.fixture(scope="module")
def engine():
    # Aging is off for this bounded run (tests/test_scheduler_fairness.py tests it): on a
    # loaded CPU a step can take seconds, and flood requests aged past 30 s would rank first.
    llm = LLM(
        device="cpu",
        max_model_len=LONG + 16,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=8,
        long_prompt_share=SHARE,
        long_prompt_tokens=2 * SHORT,
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
    """Rounds alternate (alone, then under a fresh flood), so that both see the same machine
    load: a shared CPU's speed drifts over a run."""
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:  # fresh token ids: no prefix-cache hits between requests
        return [rng.randrange(100, 40_000) for _ in range(n)]

    batch = SamplingParams(max_tokens=1, priority="batch", client="bulk")
    alone, flooded, steps = [], [], []
    for i in range(ROUNDS):
        ttft, n = _ttft(engine, f"alone{i}", prompt(SHORT))
        alone.append(ttft)
        steps.append(n)
        flood = [f"flood{i}-{k}" for k in range(3)]
        for name in flood:
            engine.add_request(name, prompt(LONG), batch)
        engine.step()  # the flood runs: a long prompt mid-prefill, two more waiting
        ttft, n = _ttft(engine, f"flooded{i}", prompt(SHORT))
        flooded.append(ttft)
        steps.append(n)
        assert engine.scheduler.num_unfinished > 0  # the flood was still there
        for name in flood:
            engine.abort(name)
        while engine.has_unfinished():
            engine.step()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    # each interactive request is prefilled in the step after it arrives, beside a chunk of at
    # most SHARE * BUDGET of the flood's tokens under the flood, as when it is alone
    assert steps == [1] * 2 * ROUNDS
    p50_alone, p50_flooded = statistics.median(alone), statistics.median(flooded)
    assert p50_flooded <= 2 * p50_alone, (
        f"interactive TTFT p50 {p50_flooded * 1e3:.0f} ms under the flood, "
        f"{p50_alone * 1e3:.0f} ms alone (more than 2x)"
    )
