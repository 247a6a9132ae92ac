"""The start-up measurement of the speculative step's cost by (batch size, k): the CostTable the
adaptive policy (policy.py) chooses k from.

For each of a few batch sizes of the decode ladder (engine.planner.formulas.graph_batch_sizes:
those in MEASURED_BATCHES that the KV pool holds; the ladder always starts at 1), that many
requests with short random prompts are started, then every k in 0..MAX_SPECULATIVE_TOKENS runs
`repetitions` timed engine steps (after one untimed step, which builds whatever the shape
needs): k random drafted tokens per request (nearly all rejected; a step's cost hardly depends
on how many are accepted), or a draft model's own k drafts (its forwards are part of the
step), k = 0 a plain decode step. A step is timed whole (schedule, forward,
verify, apply), on the device the engine runs on: it ends with the tokens on the host. The
median of the repetitions is the entry. The requests are then aborted and the counters reset.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections.abc import Sequence

from engine.planner.formulas import graph_batch_sizes
from engine.sampling_params import SamplingParams
from engine.spec.draft_length import CostTable
from engine.spec.drafter import Draft, Drafter, DraftInput, per_request_k

logger = logging.getLogger(__name__)

MAX_SPECULATIVE_TOKENS = 8
"""The largest k measured, so the largest the adaptive policy chooses."""
MEASURED_BATCHES = (1, 4, 16, 64)
"""Batch sizes measured (those the decode ladder has); the cost table interpolates between
them and grows in proportion to the batch above the largest."""
PROMPT_TOKENS = 16
REPETITIONS = 3


class RandomDrafter(Drafter):
    """Exactly k uniformly random tokens per request: the measurement's drafts."""

    name = "random"

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.gen = random.Random(seed)

    def propose(self, requests: Sequence[DraftInput], k: int | Sequence[int]) -> list[Draft]:
        return [
            Draft([self.gen.randrange(self.vocab_size) for _ in range(n)])
            for n in per_request_k(requests, k)
        ]


def measured_batches(engine) -> list[int]:
    """The batch sizes to measure: MEASURED_BATCHES on the ladder, as many as the KV pool holds
    (with room for every step's tokens and drafts)."""
    cfg = engine.config
    ladder = graph_batch_sizes(cfg.max_num_seqs)
    sizes = [b for b in ladder if b in MEASURED_BATCHES]
    bm = engine.block_manager
    tokens = max_tokens(engine.spec.drafter.needs_blocks)
    per_seq = -(-(PROMPT_TOKENS + tokens + MAX_SPECULATIVE_TOKENS) // bm.block_size)
    fits = [b for b in sizes if b * per_seq <= bm.num_free_blocks]
    if not fits:
        raise ValueError(
            f"the KV pool ({bm.num_free_blocks} free blocks of {bm.block_size} tokens) cannot "
            "hold one sequence of the speculative cost measurement: raise num_kv_blocks or pin "
            "num_speculative_tokens"
        )
    return fits


def max_tokens(all_accepted: bool = False) -> int:
    """Tokens each measured request may generate: a prefill step, then (untimed + timed) steps
    at each k, one token each or more where random drafts are accepted; k + 1 each where every
    draft may be (a draft model's)."""
    steps = REPETITIONS + 1
    if all_accepted:
        return steps * (MAX_SPECULATIVE_TOKENS + 1) * (MAX_SPECULATIVE_TOKENS + 2) // 2 + 2
    return (MAX_SPECULATIVE_TOKENS + 1) * steps * 2 + 2


def measure_costs(engine, repetitions: int = REPETITIONS) -> CostTable:
    """Time the engine's steps by (batch, k) as the module docstring says; returns the table."""
    spec = engine.spec
    cfg = engine.config
    # A draft model drafts itself: its forwards are part of the step's cost, and its drafts
    # may all be accepted. Other drafters are replaced by random drafts.
    own = spec.drafter.needs_blocks
    tokens = max_tokens(own)
    if cfg.max_model_len < PROMPT_TOKENS + tokens + 1:
        raise ValueError(
            f"max_model_len {cfg.max_model_len} is too short for the speculative cost "
            f"measurement ({PROMPT_TOKENS + tokens + 1} tokens): pin "
            "num_speculative_tokens"
        )
    vocab = engine.model_config.vocab_size
    gen = random.Random(0)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=tokens)
    drafter = spec.drafter
    if not own:
        spec.drafter = RandomDrafter(vocab)
    seconds: dict[tuple[int, int], float] = {}
    start = time.perf_counter()
    try:
        for batch in measured_batches(engine):
            ids = [f"__spec-cost-{batch}-{i}" for i in range(batch)]
            for rid in ids:
                engine.add_request(
                    rid, [gen.randrange(vocab) for _ in range(PROMPT_TOKENS)], params
                )
            spec.forced_k = 0
            while any(r.num_output_tokens == 0 for r in engine.scheduler.running) or (
                engine.scheduler.waiting
            ):
                engine.step()  # the prompts' prefill
            for k in range(MAX_SPECULATIVE_TOKENS + 1):
                spec.forced_k = k
                engine.step()  # untimed: builds what this shape needs
                times = []
                for _ in range(repetitions):
                    t0 = time.perf_counter()
                    engine.step()
                    times.append(time.perf_counter() - t0)
                seconds[(batch, k)] = statistics.median(times)
            for rid in ids:
                engine.abort(rid)
            while engine.has_unfinished():
                engine.step()
    finally:
        spec.forced_k = None
        spec.drafter = drafter
    logger.info(
        "speculative step costs measured in %.2f s: %s",
        time.perf_counter() - start,
        ", ".join(f"b={b} k={k}: {s * 1e3:.2f} ms" for (b, k), s in sorted(seconds.items())),
    )
    return CostTable(seconds)
