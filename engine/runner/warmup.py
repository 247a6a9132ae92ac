"""The warm-up's workload (LLMEngine.warm_up): the steps that reach every Triton kernel variant a
served step can reach, so none compiles while users wait.

Which variant a kernel launch needs depends on the step only through a few classes (the kernels
no longer specialise on step-varying counts or view alignments; tests/test_specialization_keys
checks that on CPU, and docs/performance.md lists them):
- the step's token count: 1 (programmatic dependent launch), below or from 64 (RoPE heads a
  program), below or from 512 (the fused RoPE + KV store), and the quantized GEMMs' row buckets
  (1, 2-16, 17-32, 33-64, 65-128, 129-256, more). Every threshold is a power of two, so lone
  prompts of 2^k - 1, 2^k and 2^k + 1 tokens (and 1, 2) reach each class;
- decode attention in an eager (mixed) step: one decode or several (programmatic dependent
  launch at one), and one split or several (contexts up to 64 tokens, or longer);
- the decode graphs' batch sizes, captured before the warm-up runs.
Sampling is PyTorch: it compiles nothing, but greedy, seeded and fully featured requests run
here too, so its first calls are made before serving.
"""

from __future__ import annotations

import random
from dataclasses import replace

from engine.sampling_params import SamplingParams

LADDER_TOP = 1024
"""The token-count ladder stops here: every threshold lies below it (the largest, 512, is the
fused RoPE + KV store's); the budget-filling step covers larger counts."""
SHORT_CONTEXT = 64
"""Decode contexts up to this many tokens take one split (decode_attention's
MIN_TOKENS_PER_SPLIT); longer ones several where the batch leaves SMs free."""

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.7, seed=1, ignore_eos=True)
EVERY_FEATURE = SamplingParams(
    temperature=0.8,
    top_p=0.9,
    top_k=50,
    min_p=0.01,
    repetition_penalty=1.1,
    presence_penalty=0.1,
    frequency_penalty=0.1,
    logprobs=5,
    ignore_eos=True,
    seed=0,
)


def token_ladder(limit: int) -> list[int]:
    """Token counts 1, 2 and 2^k - 1, 2^k, 2^k + 1 up to min(limit, LADDER_TOP), ascending."""
    top = min(limit, LADDER_TOP)
    counts = {1, 2}
    power = 4
    while power - 1 <= top:
        counts.update(n for n in (power - 1, power, power + 1) if n <= top)
        power *= 2
    return sorted(n for n in counts if 1 <= n <= top)


class WarmUp:
    """Drives an LLMEngine (add_request / step / has_unfinished) through the warm-up steps."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.config = engine.config
        self.vocab = engine.model_config.vocab_size
        self.gen = random.Random(0)
        self.count = 0

    def add(self, num_tokens: int, params: SamplingParams, max_tokens: int) -> None:
        prompt = dummy_prompt(self.engine, self.gen, num_tokens)
        self.engine.add_request(
            f"__warmup-{self.count}", prompt, replace(params, max_tokens=max_tokens)
        )
        self.count += 1

    def finish(self) -> None:
        while self.engine.has_unfinished():
            self.engine.step()

    def run(self) -> None:
        cfg = self.config
        room = cfg.max_model_len - 1  # a prompt's most tokens with one to generate
        # The full-budget step first (several prompts where max_model_len is shorter than the
        # budget): the activation peak the memory check measures is the serving one.
        for n in cfg.budget_prompt_lengths(3):
            self.add(n, GREEDY, 3)
        self.engine.step()
        self.finish()
        # Every token-count class, as a lone prefill that samples its only token.
        for i, n in enumerate(token_ladder(min(room, cfg.max_num_batched_tokens))):
            self.add(n, (GREEDY, SEEDED, EVERY_FEATURE)[i % 3], 1)
            self.finish()
        # Eager decode attention: one decode, then two, beside a prefill; short contexts (one
        # split) and long ones (several).
        most = min(room - 8, cfg.max_num_batched_tokens)  # leaves room for 6 more tokens
        for first in sorted({min(5, most), min(4 * SHORT_CONTEXT, most)} - {0}):
            if first < 1:
                continue
            self.add(first, GREEDY, 6)
            self.engine.step()
            self.add(min(20, most), EVERY_FEATURE, 4)
            self.engine.step()
            self.add(min(9, most), SEEDED, 2)
            self.finish()
        # A prompt longer than the budget: its later chunk continues after a cached prefix.
        chunked = min(room - 1, cfg.max_num_batched_tokens + 17)
        if chunked > cfg.max_num_batched_tokens:
            self.add(chunked, EVERY_FEATURE, 2)
            self.finish()


def run_peak_step(engine) -> None:
    """Queue the heaviest steps serving can meet: max_num_seqs sequences at once, the long ones
    filling the step's token budget (several where max_model_len is shorter than it), every one
    sampled with every sampling feature (penalties, top-k/top-p/min-p, logprobs), so the logits
    and sampler temporaries peak. The caller steps them to completion."""
    cfg = engine.config
    gen = random.Random(1)
    params = replace(EVERY_FEATURE, max_tokens=2)
    longs = cfg.budget_prompt_lengths(params.max_tokens) or [1]
    for i in range(cfg.max_num_seqs - len(longs)):
        engine.add_request(f"__peak-{i}", dummy_prompt(engine, gen, 1), params)
    for i, n in enumerate(longs):
        engine.add_request(f"__peak-long-{i}", dummy_prompt(engine, gen, n), params)


def dummy_prompt(engine, gen: random.Random, num_tokens: int) -> list[int]:
    """num_tokens random ids of the vocabulary, none the image placeholder (a prompt holding
    one without its image is refused)."""
    vocab = engine.model_config.vocab_size
    image = engine.image_limits[0]
    ids = [gen.randrange(vocab) for _ in range(num_tokens)]
    return [(t + 1) % vocab if t == image else t for t in ids]
