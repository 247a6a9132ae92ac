"""Batched sampling on the device: penalties, greedy, temperature, top-k/top-p/min-p, logprobs.

Randomness is counter-based: the uniform for (request seed, output index, token id) is a hash,
so a request's tokens depend on its seed alone, never on what else is in the batch or on
preemption (a recomputed request redraws exactly the same numbers). No per-request Python loop
touches the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply) on int64 tensors holding values < 2**32."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def hashed_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[num_seqs, vocab] uniforms in (0, 1) from per-row (seed, step) and the token id."""
    token_ids = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    return hashed_uniform_at(seeds, steps, token_ids[None, :])


def hashed_uniform_at(
    seeds: torch.Tensor, steps: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    """hashed_uniform's values at the given token ids only: [num_seqs, m] for token_ids
    [num_seqs or 1, m] (any id below 2**32, also ones past the vocabulary)."""
    row = _mix32(_mix32(seeds) ^ _mix32((seeds >> 32) + 0x632BE5AB))
    row = _mix32(row + (steps * 0x9E3779B9))  # [num_seqs]
    cols = _mix32(token_ids + 0x5BD1E995)  # [num_seqs or 1, m]
    bits = _mix32(row[:, None] ^ cols) >> 8  # 24 random bits, exact in fp32
    # (bits + 0.5) / 2**24 rounds to 1.0 in fp32 at the top value (2**24 - 0.5 is not an fp32),
    # and -log(-log(1)) is inf, which turns a -inf (masked) logit into NaN and wins the argmax:
    # kept below one
    return ((bits.float() + 0.5) / float(1 << 24)).clamp_(max=U_MAX)


U_MAX = 1.0 - 2.0**-24
"""The largest uniform: the fp32 just below one."""


@dataclass
class SamplingTensors:
    """Per-row sampling settings for one step, already on the device."""

    temperature: torch.Tensor  # [num_seqs] float32 (0 = greedy)
    top_k: torch.Tensor  # [num_seqs] int64 (vocab size = off)
    top_p: torch.Tensor  # [num_seqs] float32
    min_p: torch.Tensor  # [num_seqs] float32
    seeds: torch.Tensor  # [num_seqs] int64
    steps: torch.Tensor  # [num_seqs] int64: index of the token being sampled
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    max_logprobs: int | None  # None = nobody asked for logprobs
    # Penalties (None when no row has any)
    repetition: torch.Tensor | None = None  # [num_seqs]
    presence: torch.Tensor | None = None  # [num_seqs]
    frequency: torch.Tensor | None = None  # [num_seqs]
    output_counts: torch.Tensor | None = None  # [num_seqs, vocab] float32
    seen_mask: torch.Tensor | None = None  # [num_seqs, vocab] bool: in prompt or output


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [num_seqs] int64
    logprobs: torch.Tensor | None  # [num_seqs] chosen-token logprob
    top_ids: torch.Tensor | None  # [num_seqs, max_logprobs]
    top_logprobs: torch.Tensor | None  # [num_seqs, max_logprobs]


def apply_penalties(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    if t.repetition is not None:
        rep = t.repetition[:, None]
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(t.seen_mask, penalised, logits)
    if t.frequency is not None:
        logits = logits - t.frequency[:, None] * t.output_counts
        logits = logits - t.presence[:, None] * (t.output_counts > 0).float()
    return logits


def _filter(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Mask (-inf) tokens removed by top-k, top-p and min-p. logits: [num_seqs, vocab]."""
    if t.any_min_p:
        probs = logits.softmax(-1)
        threshold = t.min_p[:, None] * probs.max(-1, keepdim=True).values
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    if not (t.any_top_k or t.any_top_p):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    remove = ranks >= t.top_k[:, None]
    if t.any_top_p:
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # keep tokens until the mass reaches top_p
        remove |= mass_before >= t.top_p[:, None]
    remove[:, 0] = False  # always keep the most likely token
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def scale_and_filter(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """[num_seqs, vocab] fp32 logits (penalties applied) -> the logits the sampler draws from:
    divided by the temperature (greedy rows: by 1) and masked by top-k/top-p/min-p.
    softmax of the result is the request's sampling distribution p."""
    temp = torch.where(t.temperature > 0, t.temperature, torch.ones_like(t.temperature))
    return _filter(logits / temp[:, None], t)


def sample(logits: torch.Tensor, t: SamplingTensors) -> SamplerOutput:
    """logits: [num_seqs, vocab] (raw model output, any float dtype: widened to fp32 here
    unless every row is plain greedy, where argmax of the 16-bit values picks the same id)."""
    if t.all_greedy and t.max_logprobs is None and t.repetition is None and t.frequency is None:
        return SamplerOutput(logits.argmax(-1), None, None, None)
    logits = logits.float()
    raw_logprobs = logits.log_softmax(-1) if t.max_logprobs is not None else None
    logits = apply_penalties(logits, t)
    greedy = logits.argmax(-1)
    if t.all_greedy:
        tokens = greedy
    else:
        scaled = scale_and_filter(logits, t)
        uniform = hashed_uniform(t.seeds, t.steps, logits.shape[-1])
        # Gumbel-max: argmax(log p - log(-log u)) draws from softmax(scaled)
        drawn = (scaled - torch.log(-torch.log(uniform))).argmax(-1)
        tokens = torch.where(t.temperature > 0, drawn, greedy)
    if raw_logprobs is None:
        return SamplerOutput(tokens, None, None, None)
    chosen = raw_logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    top = raw_logprobs.topk(max(t.max_logprobs, 1), dim=-1)
    return SamplerOutput(tokens, chosen, top.indices, top.values)
