"""The speculative decode step: drafts before scheduling, verification of the forward's logits,
and the tokens, KV counts and blocks after it.

A step with drafts runs without the overlap of steps (its drafts need the last step's tokens on
the host: when the policy chooses to draft, the engine first reads back an overlapped step in
flight; a step where nobody drafts stays overlapped): propose (each running decode gets up to
k drafted tokens in `Request.spec_tokens`; a draft model drafts after scheduling, into
positions reserved before it), schedule (the scheduler trims them to the token budget and the
free KV blocks), one forward over each decode's last token and its drafts (the paged attention's
prefill path: several query tokens over the sequence's cache) with the logits of every one of
those positions, verify (engine/spec/verify.py), then `apply`: each request appends the
accepted drafts and the target's token one at a time (so EOS, stop ids and max_tokens end it
at the same token as plain decoding), its computed count keeps only the positions whose K/V
are right (the last token and the accepted drafts), and the blocks past its tokens are freed.

k: a pinned num_speculative_tokens, or else the adaptive policy's choice each step
(engine/spec/draft_length.py), from the step costs measured at start-up (engine/spec/measure.py,
`SpecDecoder.measure`) and the acceptance observed after each verification.

Requests with a grammar do not draft (their rows are masked as in a plain step), and a model
with linear-attention layers does not speculate at all (a rejected draft would have advanced
its recurrent state): the engine leaves `SpecDecoder` out for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import accumulate

import torch

from engine.config import EngineConfig
from engine.models.model_config import ModelConfig
from engine.scheduling.request import Logprob, Request
from engine.spec.draft_length import CostTable, SpecPolicy
from engine.spec.draft_model import DraftModel, DraftModelDrafter
from engine.spec.drafter import Drafter
from engine.spec.measure import MAX_SPECULATIVE_TOKENS, measure_costs
from engine.spec.ngram import NgramDrafter
from engine.spec.verify import verify
from engine.structured.bitmask import apply_bitmask

logger = logging.getLogger(__name__)

RESERVED = 0
"""The token a draft position holds between reservation and drafting (needs_blocks drafters)."""


@dataclass
class SpecCounters:
    """Totals since start (vLLM's spec_decode counters, and what /v1/stats derives)."""

    num_drafts: int = 0
    """Verifications of a non-empty draft."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def report(self) -> dict:
        rate = self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None
        mean = self.num_accepted_tokens / self.num_drafts if self.num_drafts else None
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": rate,
            "mean_accepted_length": mean,
        }


def spec_decoder(
    config: EngineConfig, model: ModelConfig, draft: DraftModel | None = None
) -> SpecDecoder | None:
    """The engine's SpecDecoder for config.speculative, or None (off); `draft`: the model
    runner's draft model, for speculative="draft:PATH"."""
    if config.speculative == "off":
        return None
    if model.linear_layer_ids():
        logger.info(
            "speculative decoding is off for this model: a rejected draft would have advanced "
            "the recurrent state of its linear-attention layers"
        )
        return None
    drafter = None
    if config.draft_model is not None:
        if draft is None:
            raise ValueError(f"speculative={config.speculative!r} needs its draft model loaded")
        drafter = DraftModelDrafter(draft, config.max_num_batched_tokens)
    return SpecDecoder(config.num_speculative_tokens, drafter)


class SpecDecoder:
    """Drafts, verifies and applies speculative decode steps for one engine."""

    def __init__(self, k: int | None, drafter: Drafter | None = None) -> None:
        """k: drafts per request and step, fixed; None: the adaptive policy chooses up to
        MAX_SPECULATIVE_TOKENS each step, once `measure` (or `use_costs`) gave it costs."""
        if k is not None and (not isinstance(k, int) or k < 1):
            raise ValueError(f"num_speculative_tokens must be a positive integer, got {k!r}")
        self.adaptive = k is None
        self.k = MAX_SPECULATIVE_TOKENS if k is None else k
        self.drafter = drafter or NgramDrafter()
        self.counters = SpecCounters()
        self.policy: SpecPolicy | None = None
        self.last_k = 0 if k is None else k
        """The k of the last step that drafted (or chose not to: 0)."""
        self.forced_k: int | None = None
        """Set by the cost measurement: every request drafts exactly this many, no policy."""
        self._drafted: list[Request] = []

    def measure(self, engine, timer) -> bool:
        """Adaptive k: measure the engine's step costs (measure.py; the start-up phase
        "spec_costs" of `timer`) and start the policy. Returns whether it measured (the
        engine then resets its counters); a pinned k measures nothing."""
        if not self.adaptive:
            return False
        with timer.phase("spec_costs"):
            self.use_costs(measure_costs(engine))
        return True

    def use_costs(self, costs: CostTable) -> None:
        """Start the adaptive policy on this cost table (tests inject synthetic ones here)."""
        self.adaptive = True
        self.policy = SpecPolicy(costs, max_k=MAX_SPECULATIVE_TOKENS)

    def report(self) -> dict:
        """The counters (SpecCounters.report) and the last chosen k."""
        return {**self.counters.report(), "k": self.last_k}

    def _ks(self, reqs: list[Request], batch: int) -> list[int]:
        """Drafts for each of reqs (the requests that may draft, of `batch` running)."""
        if self.forced_k is not None:
            return [self.forced_k] * len(reqs)
        if self.policy is None:
            return [self.k] * len(reqs)
        ids = [r.request_id for r in reqs]
        decision = self.policy.choose(ids, self.drafter.name, others=batch - len(reqs))
        self.last_k = decision.k
        return decision.per_request

    def propose(self, running: list[Request]) -> bool:
        """Give each running decode without a grammar up to k drafts (never past max_tokens).
        Returns whether any request got one; with none the engine runs a plain step."""
        return self.draft(self.choose(running))

    def choose(self, running: list[Request]) -> list[tuple[Request, int]]:
        """The running decodes (without a grammar, with tokens left to generate) that draft
        this step and their k (the policy's choice: call once a step); [] for a plain step.
        A decode whose input token is still on the device (an overlapped step) counts: the
        engine reads that step back before `draft`, which needs the tokens on the host."""
        reqs = [
            r
            for r in running
            if r.grammar is None
            and r.num_tokens - r.num_computed_tokens == 1
            and r.params.max_tokens - r.num_output_tokens > 1
        ]
        if not reqs:
            return []
        return [(r, k) for r, k in zip(reqs, self._ks(reqs, len(running))) if k]

    def draft(self, chosen: list[tuple[Request, int]]) -> bool:
        """Draft for the chosen requests still running with their tokens on the host (never
        past max_tokens). Returns whether any request got a draft."""
        reqs, ks = [], []
        for r, k in chosen:
            left = r.params.max_tokens - r.num_output_tokens - 1
            if not r.is_finished and r.num_pending == 0 and left > 0:
                reqs.append(r)
                ks.append(min(k, left))
        if not reqs:
            return False
        if self.drafter.needs_blocks:  # reserved now, drafted once scheduled (draft_scheduled)
            drafts = [[RESERVED] * k for k in ks]
        else:
            drafts = [d.token_ids for d in self.drafter.propose(reqs, ks)]
        for req, draft in zip(reqs, drafts):
            if draft:
                req.spec_tokens = list(draft)
                self._drafted.append(req)
        return bool(self._drafted)

    def draft_scheduled(self, batch) -> None:
        """A drafter that needs blocks (a draft model) drafts now, for the scheduled requests'
        reserved draft positions, whose blocks the scheduler allocated."""
        if not self.drafter.needs_blocks:
            return
        reqs = [r for r in batch.requests if r.spec_tokens]
        if not reqs:
            return
        drafts = self.drafter.propose(reqs, [len(r.spec_tokens) for r in reqs])
        for req, draft in zip(reqs, drafts):
            if len(draft.token_ids) != len(req.spec_tokens):
                raise RuntimeError(
                    f"the {self.drafter.name} drafter gave {len(draft.token_ids)} tokens for "
                    f"{len(req.spec_tokens)} scheduled draft positions"
                )
            req.spec_tokens = list(draft.token_ids)

    @torch.inference_mode()
    def verify(self, fwd, constrained: list, grammars) -> dict[int, list[tuple[int, Logprob]]]:
        """Verify a forward's drafts: batch index -> the tokens to emit (with their logprobs
        where asked), the accepted drafts then the target's own. constrained: (sampled row,
        grammar) of the requests with a grammar (they have no drafts: one logits row each),
        masked by `grammars` (the engine's GrammarPool) as in a plain step."""
        reqs = fwd.sampling_requests
        if not reqs:
            return {}
        ks = [len(r.spec_tokens) for r in reqs]
        logits = fwd.logits  # [sum(ks) + len(reqs), vocab]
        bitmask = grammars.masks(constrained, len(reqs)) if constrained else None
        if bitmask is not None:  # [len(reqs), words] -> each request's first logits row
            ends = accumulate(k + 1 for k in ks)
            first = [end - k - 1 for end, k in zip(ends, ks)]
            full = torch.full((logits.shape[0], bitmask.shape[1]), -1, dtype=torch.int32)
            full[first] = bitmask
            logits = apply_bitmask(logits, full)
        width = max(ks)
        drafts = torch.tensor(  # [len(reqs), width]: each request's drafts, 0-padded
            [r.spec_tokens + [0] * (width - len(r.spec_tokens)) for r in reqs], dtype=torch.int64
        ).view(len(reqs), width)
        out = verify(logits, drafts.to(logits.device), ks, fwd.sampling)
        tokens, counts = out.token_ids.tolist(), out.num_emitted.tolist()
        lps = None if out.logprobs is None else out.logprobs.tolist()
        top_ids = None if out.top_ids is None else out.top_ids.tolist()
        top_lps = None if out.top_logprobs is None else out.top_logprobs.tolist()
        result = {}
        for row, (i, req) in enumerate(zip(fwd.sampling_rows, reqs)):
            n = req.params.logprobs
            emitted = []
            for j in range(counts[row]):
                logprob = None
                if n is not None:
                    top = list(zip(top_ids[row][j][:n], top_lps[row][j][:n]))
                    logprob = Logprob(tokens[row][j], lps[row][j], top)
                emitted.append((tokens[row][j], logprob))
            result[i] = emitted
            if ks[row]:
                c = self.counters
                c.num_drafts += 1
                c.num_draft_tokens += ks[row]
                c.num_accepted_tokens += counts[row] - 1
                req.metrics.num_draft_tokens += ks[row]
                req.metrics.num_accepted_tokens += counts[row] - 1
                if self.policy is not None and self.forced_k is None:
                    self.policy.observe(req.request_id, self.drafter.name, ks[row], counts[row] - 1)
        return result

    def apply(self, scheduler, batch, emitted: dict[int, list[tuple[int, Logprob]]]) -> list:
        """Append each request's emitted tokens (stopping at the first that finishes it), keep
        the K/V count to the positions computed right, free the blocks of rejected drafts.
        Returns the requests that got tokens."""
        bm = scheduler.block_manager
        touched = []
        for i, tokens in emitted.items():
            req = batch.requests[i]
            rejected = len(req.spec_tokens) - (len(tokens) - 1)
            req.spec_tokens = []
            if req.is_finished:
                continue
            req.num_computed_tokens -= rejected
            for token, logprob in tokens:
                req.append_token(token, logprob)
                if req.is_finished:
                    break
            touched.append(req)
            if req.is_finished:
                scheduler.finish(req, req.status)  # frees its blocks, leaves the queues
                continue
            bm.trim(req, req.num_tokens)
            if req.num_computed_tokens // bm.block_size > len(req.block_keys):
                bm.cache_full_blocks(req)
        self.clear()
        return touched

    def clear(self) -> None:
        """Drop the drafts of requests that were not scheduled (budget, preemption)."""
        for req in self._drafted:
            req.spec_tokens = []
        self._drafted = []

    def release(self, request_id: str) -> None:
        self.drafter.release(request_id)
        if self.policy is not None:
            self.policy.release(request_id)
