"""Verification of drafted tokens: from the target's logits over each sequence's last token and
its k drafts, the tokens to emit (the accepted drafts, then one token of the target's own).

Row j of a sequence samples its output index `steps + j`, with the request's penalties
counting drafts 0..j-1 as already generated, then its temperature and top-k/top-p/min-p,
exactly as engine/runner/sampler.py does for a token at that index (rows after the first rejection
are discarded, so assuming the drafts were accepted is the right context for every kept row).

- Greedy rows: accept while the draft is the argmax; then the argmax.
- Drafts with a distribution q (a draft model): standard rejection sampling. Accept x with
  probability min(1, p(x)/q(x)) using the uniform `hashed_uniform(seed, steps + j)` gives for
  the token id ACCEPT_COLUMN (a column no vocabulary reaches, independent of the Gumbel noise
  of the real ids); on the first rejection draw from norm(max(0, p - q)) by Gumbel-max with the
  uniforms of that row; if all are accepted, a bonus token from p.
- One-hot drafts (n-gram): each row draws its token y exactly as the sampler would
  (Gumbel-max with hashed_uniform(seed, steps + j)); the draft x is accepted iff x == y, and on
  the first mismatch y is emitted. That is the same rejection sampling: P(accept) = p(x) =
  min(1, p(x)/q(x)) with q one-hot, and a rejected row's y is p conditioned on y != x, which is
  norm(max(0, p - q)). Because every emitted token is the sampler's own draw for its index, a
  seeded request's tokens are identical with speculation on or off, at any k.

No loop over vocabulary entries or sequences: everything is done on [num_seqs, k + 1, vocab].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from engine.runner.sampler import (
    SamplingTensors,
    apply_penalties,
    hashed_uniform,
    hashed_uniform_at,
    sample,
    scale_and_filter,
)

ACCEPT_COLUMN = (1 << 32) - 1
"""Token id whose hashed uniform decides acceptance: above any vocabulary, so the uniform is
independent of the Gumbel noise the real ids get at the same (seed, step)."""


@dataclass
class VerifyOutput:
    token_ids: torch.Tensor  # [num_seqs, max_k + 1] int64: emitted tokens, -1 past num_emitted
    num_emitted: torch.Tensor  # [num_seqs] int64: accepted drafts + 1
    logprobs: torch.Tensor | None  # [num_seqs, max_k + 1] raw logprob of each emitted token
    top_ids: torch.Tensor | None  # [num_seqs, max_k + 1, max_logprobs]
    top_logprobs: torch.Tensor | None  # [num_seqs, max_k + 1, max_logprobs]

    @property
    def num_accepted(self) -> torch.Tensor:  # [num_seqs]
        return self.num_emitted - 1


def verify(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    num_drafts: Sequence[int],
    t: SamplingTensors,
    draft_probs: torch.Tensor | None = None,
) -> VerifyOutput:
    """Accept or reject each sequence's drafts.

    logits: [sum(num_drafts) + num_seqs, vocab]: per sequence in order, the target's logits
        after its last token and after each of its drafts (num_drafts[i] + 1 rows).
    drafts: [num_seqs, max_k] int64, row i valid up to num_drafts[i] (the rest is ignored).
    num_drafts: drafts per sequence (0 = plain decoding for that sequence).
    t: the sequences' sampling tensors as for a plain step (steps = index of row 0's token;
        penalty counts from the output before the drafts).
    draft_probs: [num_seqs, max_k, vocab] the distribution each draft was drawn from, or None
        when every draft is one-hot (q(x) = 1).
    """
    num_seqs, max_k = drafts.shape
    vocab = logits.shape[-1]
    ks = list(num_drafts)
    _check(logits, drafts, ks, t, draft_probs)
    device = logits.device
    ks_dev = torch.tensor(ks, dtype=torch.int64, device=device)  # [num_seqs]
    col = torch.arange(max_k + 1, device=device)  # [max_k + 1]
    is_draft = col[None, :max_k] < ks_dev[:, None]  # [num_seqs, max_k]
    if bool((is_draft & ((drafts < 0) | (drafts >= vocab))).any()):
        raise ValueError(f"draft token ids must be in [0, {vocab}) (the target's vocabulary)")
    drafts = torch.where(is_draft, drafts, 0)
    # rows of `logits` for each (sequence, j); j past the sequence's drafts repeats its last row
    starts = torch.tensor([0] + ks[:-1], dtype=torch.int64, device=device).cumsum(0)
    starts = starts + torch.arange(num_seqs, device=device)  # [num_seqs]: ks + 1 rows each
    rows = starts[:, None] + torch.minimum(col[None, :], ks_dev[:, None])  # [num_seqs, max_k + 1]
    grid = logits[rows.flatten()]  # [num_seqs * (max_k + 1), vocab]
    tg = _expand(t, drafts, is_draft, max_k, vocab)
    if draft_probs is None:
        out = sample(grid, tg)
        tokens = out.token_ids.view(num_seqs, max_k + 1)
        accept = is_draft & (drafts == tokens[:, :max_k])  # [num_seqs, max_k]
        logprobs, top_ids, top_logprobs = out.logprobs, out.top_ids, out.top_logprobs
    else:
        tokens, accept = _rejection_sample(grid, tg, drafts, draft_probs, is_draft)
        logprobs = top_ids = top_logprobs = None
        if t.max_logprobs is not None:
            raw = grid.float().log_softmax(-1)  # [rows, vocab]
            logprobs = raw.gather(-1, tokens.flatten()[:, None]).squeeze(-1)
            top = raw.topk(max(t.max_logprobs, 1), dim=-1)
            top_ids, top_logprobs = top.indices, top.values
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [num_seqs]: drafts before the first miss
    emitted = col[None, :] <= num_accepted[:, None]  # [num_seqs, max_k + 1]
    token_ids = torch.where(emitted, tokens, -1)
    shape = (num_seqs, max_k + 1)
    return VerifyOutput(
        token_ids=token_ids,
        num_emitted=num_accepted + 1,
        logprobs=None if logprobs is None else logprobs.view(shape),
        top_ids=None if top_ids is None else top_ids.view(*shape, -1),
        top_logprobs=None if top_logprobs is None else top_logprobs.view(*shape, -1),
    )


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to draw from after rejecting a draft from q: max(0, p - q), unnormalised
    (Gumbel-max needs no normalisation); p itself where p - q has no positive mass."""
    res = (p - q).clamp_min(0.0)  # [rows, vocab]
    empty = res.sum(-1, keepdim=True) <= 0
    return torch.where(empty, p, res)


def _rejection_sample(
    grid: torch.Tensor,
    tg: SamplingTensors,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    is_draft: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [num_seqs, max_k + 1], accept [num_seqs, max_k]) for drafts with distribution q."""
    num_seqs, max_k = drafts.shape
    vocab = grid.shape[-1]
    logits = apply_penalties(grid.float(), tg)  # [rows, vocab]
    greedy = logits.argmax(-1).view(num_seqs, max_k + 1)
    p = scale_and_filter(logits, tg).softmax(-1).view(num_seqs, max_k + 1, vocab)
    uniform = hashed_uniform(tg.seeds, tg.steps, vocab)  # [rows, vocab]: the sampler's noise
    gumbel = -torch.log(-torch.log(uniform)).view(num_seqs, max_k + 1, vocab)
    cols = torch.full_like(tg.seeds, ACCEPT_COLUMN)[:, None]  # [rows, 1]
    u_accept = hashed_uniform_at(tg.seeds, tg.steps, cols).view(num_seqs, max_k + 1)[:, :max_k]
    q = torch.zeros_like(p)  # [num_seqs, max_k + 1, vocab]: the bonus row has no q
    q[:, :max_k] = torch.where(is_draft[..., None], draft_probs.float(), 0.0)
    p_x = p[:, :max_k].gather(-1, drafts[..., None]).squeeze(-1)  # [num_seqs, max_k]
    q_x = q[:, :max_k].gather(-1, drafts[..., None]).squeeze(-1)
    sampled = (residual(p, q).log() + gumbel).argmax(-1)  # [num_seqs, max_k + 1]
    is_greedy = (tg.temperature == 0).view(num_seqs, max_k + 1)
    accept = torch.where(is_greedy[:, :max_k], drafts == greedy[:, :max_k], u_accept * q_x < p_x)
    accept &= is_draft
    tokens = torch.where(is_greedy, greedy, sampled)
    tokens[:, :max_k] = torch.where(accept, drafts, tokens[:, :max_k])
    return tokens, accept


def _expand(
    t: SamplingTensors, drafts: torch.Tensor, is_draft: torch.Tensor, max_k: int, vocab: int
) -> SamplingTensors:
    """Per-sequence sampling tensors -> per (sequence, j) rows: step + j, and penalty state
    counting drafts 0..j-1 as generated."""
    num_seqs = drafts.shape[0]
    width = max_k + 1

    def rep(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.repeat_interleave(width, dim=0)

    offsets = torch.arange(width, device=t.steps.device).repeat(num_seqs)  # [rows]
    out = replace(
        t,
        temperature=rep(t.temperature),
        top_k=rep(t.top_k),
        top_p=rep(t.top_p),
        min_p=rep(t.min_p),
        seeds=rep(t.seeds),
        steps=rep(t.steps) + offsets,
        repetition=rep(t.repetition),
        presence=rep(t.presence),
        frequency=rep(t.frequency),
    )
    if t.output_counts is None and t.seen_mask is None:
        return out
    one_hot = torch.zeros(num_seqs, max_k, vocab, device=drafts.device)
    one_hot.scatter_(-1, drafts[..., None], is_draft[..., None].float())
    before = torch.zeros(num_seqs, width, vocab, device=drafts.device)
    before[:, 1:] = one_hot.cumsum(1)  # [num_seqs, max_k + 1, vocab]: drafts before row j
    if t.output_counts is not None:
        out.output_counts = (t.output_counts[:, None] + before).view(-1, vocab)
    if t.seen_mask is not None:
        out.seen_mask = (t.seen_mask[:, None] | (before > 0)).view(-1, vocab)
    return out


def _check(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    ks: list[int],
    t: SamplingTensors,
    draft_probs: torch.Tensor | None,
) -> None:
    num_seqs, max_k = drafts.shape
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    if len(ks) != num_seqs or t.seeds.shape[0] != num_seqs:
        raise ValueError(
            f"{num_seqs} draft rows, {len(ks)} draft counts and {t.seeds.shape[0]} sampling rows:"
            " give one of each per sequence"
        )
    if any(k < 0 or k > max_k for k in ks):
        raise ValueError(f"draft counts must be in [0, {max_k}] (drafts' width), got {ks}")
    if logits.shape[0] != sum(ks) + num_seqs:
        raise ValueError(
            f"logits has {logits.shape[0]} rows; sequences with {ks} drafts need "
            f"{sum(ks) + num_seqs} (each draft's row plus the last token's)"
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (num_seqs, max_k, logits.shape[1]):
        raise ValueError(
            f"draft_probs must be [num_seqs, max_k, vocab] = {(num_seqs, max_k, logits.shape[1])}"
            f", got {tuple(draft_probs.shape)}"
        )
