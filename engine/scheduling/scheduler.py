"""Scheduler: continuous batching. Who runs this step, how many tokens each, who is preempted;
the order and the shares come from engine.scheduling.scheduling_policy.

Each step has a token budget (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`).
Running decodes are scheduled first, then running prefills (chunked: a long prompt is split
across steps), then new requests from the waiting queue in the policy's rank (class, fair
share, short first, aging). While a short request waits, long prompts' chunks take at most the
policy's share of the budget. A waiting request that does not fit the KV pool may be passed by
a later one that does, unless it is aged: then admission stops until it fits. When KV blocks run
out, a running request is preempted by recompute (the batch class first, then the most recently
admitted): its blocks are freed and it goes back to the queue, ahead of the requests of its
class never admitted; later it re-prefills prompt + output so far and continues with exactly
the tokens it would have produced.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from engine.config import EngineConfig
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.request import Request, RequestStatus
from engine.scheduling.scheduling_policy import SchedulingPolicy


@dataclass
class ScheduledBatch:
    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_decodes: int = 0
    """The first num_decodes requests are single-token decodes."""
    preempted: list[Request] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.requests

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @cached_property
    def sampling_indices(self) -> list[int]:
        """Requests that reach their last known token this step, and so sample one. Read after
        scheduling and before advance (it depends on num_computed_tokens)."""
        return [i for i in self._last_token_indices if not self.requests[i].is_pooling]

    @cached_property
    def pooling_indices(self) -> list[int]:
        """Pooling requests (SamplingParams.pooling) whose prefill ends this step: they sample
        nothing; the runner pools their hidden states and they finish. Read like
        sampling_indices."""
        return [i for i in self._last_token_indices if self.requests[i].is_pooling]

    @cached_property
    def _last_token_indices(self) -> list[int]:
        return [
            i
            for i, (req, num_new) in enumerate(zip(self.requests, self.num_new_tokens))
            if req.num_computed_tokens + num_new - len(req.spec_tokens) == req.num_tokens
        ]


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        clock: Callable[[], float] = time.time,
        whole_prompts: bool = False,
        whole_images: bool = False,
    ) -> None:
        """whole_prompts: each prompt runs in one step, never in chunks (an encoder's tokens
        attend both ways); the budget is then always max_num_batched_tokens. whole_images: a
        chunk never ends inside an image's placeholders (they attend to each other both ways,
        Gemma 3 and 4)."""
        self.config = config
        self.whole_prompts = whole_prompts
        self.whole_images = whole_images
        self.encoder_left = config.max_encoder_tokens
        """Image placeholders this step may still send to the vision encoder."""
        self.block_manager = block_manager
        self.policy = SchedulingPolicy(config, clock)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.prefix_queries = 0
        """Prompt tokens looked up in the prefix cache at first admission (a counter)."""
        self.prefix_hits = 0
        """Of those, tokens found cached."""

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        req.record("queued")
        self.waiting.append(req)

    def finish(self, req: Request, status: RequestStatus) -> None:
        """End a request (stop string, abort): free its blocks and drop it from the queues."""
        req.finish(status)
        self._release(req)

    def _release(self, req: Request) -> None:
        self._free_blocks(req)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def token_budget(self) -> int:
        """Tokens this step may process. Fixed, or (adaptive_batching) growing linearly from
        min_num_batched_tokens with an empty queue to max_num_batched_tokens once max_num_seqs
        requests wait: small steps keep running requests' token latency low when the queue is
        short, large ones drain a long queue."""
        cfg = self.config
        if not cfg.adaptive_batching or self.whole_prompts:
            return cfg.max_num_batched_tokens
        low = min(cfg.min_num_batched_tokens, cfg.max_num_batched_tokens)
        fill = min(1.0, len(self.waiting) / cfg.max_num_seqs)
        return max(low, round(low + (cfg.max_num_batched_tokens - low) * fill))

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = step_budget = self.token_budget()
        self.encoder_left = self.config.max_encoder_tokens
        long_left = None  # a short request waiting for a seat gains nothing from the cap
        if len(self.running) < self.config.max_num_seqs:
            long_left = self.policy.long_allowance(step_budget, self.waiting)
        decodes = [
            r
            for r in self.running
            if r.num_tokens - r.num_computed_tokens == 1 and not r.is_awaiting_last_token
        ]
        prefills = [r for r in self.running if r.num_tokens - r.num_computed_tokens > 1]
        for n, req in enumerate(decodes + prefills):
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this step
                continue
            if req.spec_tokens:  # drafts leave a token of budget to each decode after this one
                self._fit_drafts(req, budget - (len(decodes) - 1 - n))
            num_new, is_long = self._chunk(req, budget, step_budget, long_left)
            if num_new and self._allocate_or_preempt(req, num_new, batch):
                self._add_to_batch(batch, req, num_new)
                budget = max(0, budget - num_new)  # a whole image may pass the adaptive budget
                if is_long:
                    long_left = max(0, long_left - num_new)
        if not batch.preempted:
            self._admit_waiting(batch, budget, step_budget, long_left)
        return batch

    def _fit_drafts(self, req: Request, budget: int) -> None:
        """Trim a decode's drafted tokens to what `budget` tokens and the free blocks hold, leaving
        a block for each running request's next token (it takes those blocks now: drafts never
        preempt anyone, nor take the blocks that would spare a preemption)."""
        bm = self.block_manager
        spare = max(0, bm.num_free_blocks - len(self.running))
        room = (len(req.block_table) + spare) * bm.block_size
        del req.spec_tokens[max(0, min(budget, room - req.num_computed_tokens) - 1) :]
        bm.allocate(req, req.num_computed_tokens + 1 + len(req.spec_tokens))

    def _chunk(
        self, req: Request, budget: int, step_budget: int, long_left: int | None
    ) -> tuple[int, bool]:
        """Tokens req may compute with budget left of step_budget, and whether they count
        against long_left (None: long prompts are not limited this step)."""
        num_left = req.num_tokens - req.num_computed_tokens + len(req.spec_tokens)
        num_new, is_long = min(num_left, budget), False
        if long_left is not None and self.policy.is_long(req, step_budget):
            num_new, is_long = min(num_new, long_left), True
        if self.whole_prompts and num_new < num_left:
            return 0, False  # waits for a step with room for all of it
        if num_new and req.has_images_ahead:
            room = budget + max(0, self.config.max_num_batched_tokens - step_budget)
            num_new = self._fit_images(req, num_new, room)
        return num_new, is_long

    def _fit_images(self, req: Request, num_new: int, room: int) -> int:
        """num_new cut (or, up to `room` tokens, grown) so that the chunk encodes no more image
        placeholders than the step's encoder budget has left (the first image of a step always
        goes) and, with whole_images, ends outside every image."""
        start = req.num_computed_tokens
        end = start + num_new
        encoder_left = self.encoder_left
        for image in req.images:
            if image.end <= start:
                continue
            if image.offset >= end:
                break
            if image.hash not in req.images_encoded:
                if image.length > encoder_left and encoder_left < self.config.max_encoder_tokens:
                    end = image.offset  # the encoder budget is spent: the image waits
                    break
                encoder_left -= image.length
            if self.whole_images and end < image.end:
                if image.offset > start:
                    end = image.offset
                    break
                if image.end - start > room:
                    return 0  # waits for a step with room for the whole image
                end = image.end
        return max(0, end - start)

    def _admit_waiting(
        self, batch: ScheduledBatch, budget: int, step_budget: int, long_left: int | None
    ) -> None:
        """Admit waiting requests in the policy's order while budget and seats last. One that
        does not fit is passed by later ones, unless it is the oldest aged one (then admission
        stops, so its blocks come free); a later one needing as many tokens as a failed one is
        not tried. The oldest aged request is not held back by the long-prompt share either:
        no request is admitted before it."""
        if budget == 0 or len(self.running) >= self.config.max_num_seqs or not self.waiting:
            return
        now = self.policy.clock()
        smallest_failed = None
        anchor = self.policy.oldest_aged(self.waiting, now)
        for req in self.policy.order(self.waiting, step_budget):
            if budget == 0 or len(self.running) >= self.config.max_num_seqs:
                break
            is_aged = req is anchor
            # an aged request is not held back by the long share: nothing passes it
            num_new, is_long = self._chunk(req, budget, step_budget, None if is_aged else long_left)
            if num_new == 0 or (smallest_failed is not None and num_new >= smallest_failed):
                continue
            if not self._admit(req, num_new):
                if is_aged:
                    break
                smallest_failed = num_new
                continue
            # a cached prefix may leave fewer tokens to compute, and start inside an image
            num_new = min(req.num_tokens - req.num_computed_tokens, num_new)
            if req.has_images_ahead:
                room = budget + max(0, self.config.max_num_batched_tokens - step_budget)
                num_new = self._fit_images(req, num_new, room)
            if is_aged:
                req.record("aged", waited_s=round(now - req.metrics.arrival_time, 3))
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if num_new == 0:  # admitted; its image starts in a later step
                continue
            self._add_to_batch(batch, req, num_new)
            budget = max(0, budget - num_new)
            if is_long:
                long_left = max(0, long_left - num_new)

    def _admit(self, req: Request, max_new: int) -> bool:
        """Give a waiting request its blocks: the longest cached prefix of its known tokens
        (all but the last: its logits must be computed), then room for this step's tokens (at
        most max_new). False, changing nothing, when they do not fit."""
        bm = self.block_manager
        known = req.num_tokens - req.num_pending
        cached = bm.match_prefix(req, known - 1)
        start = len(cached) * bm.block_size
        if not bm.allocate_with_prefix(req, cached, start + min(req.num_tokens - start, max_new)):
            req.block_keys = []
            return False
        req.num_computed_tokens = start
        if req.metrics.first_scheduled_time is None:  # recomputation after preemption: no
            self.prefix_queries += req.num_prompt_tokens
            hit = min(start, req.num_prompt_tokens)
            self.prefix_hits += hit
            req.metrics.num_cached_tokens = hit
            if hit:
                req.record("prefix_cache_hit", tokens=hit)
        return True

    def _allocate_or_preempt(self, req: Request, num_new: int, batch: ScheduledBatch) -> bool:
        """Allocate blocks for req, preempting unscheduled running requests in the policy's
        order (or req itself) until it fits. Returns whether req stays scheduled."""
        while True:
            if self.block_manager.allocate(req, req.num_computed_tokens + num_new):
                return True
            scheduled = set(map(id, batch.requests))
            victim = self.policy.victim(
                req, [r for r in self.running if r is not req and id(r) not in scheduled]
            )
            self._preempt(victim, batch)
            if victim is req:
                return False

    def _free_blocks(self, req: Request) -> None:
        """Free a request's blocks; its full ones stay in the prefix cache."""
        self.block_manager.cache_full_blocks(req)
        self.block_manager.free(req)

    def _preempt(self, req: Request, batch: ScheduledBatch) -> None:
        self.running.remove(req)
        self._free_blocks(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.metrics.num_preemptions += 1
        req.record("preempted")
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        batch.preempted.append(req)

    def _add_to_batch(self, batch: ScheduledBatch, req: Request, num_new: int) -> None:
        self.policy.charge(req, num_new)
        start = req.num_computed_tokens
        for image in req.images if req.has_images_ahead else ():
            if image.overlaps(start, start + num_new) and image.hash not in req.images_encoded:
                req.images_encoded.add(image.hash)
                self.encoder_left -= image.length
        bm = self.block_manager
        if bm.caching and (req.num_computed_tokens + num_new) // bm.block_size > len(
            req.block_keys
        ):
            # Key the blocks this step fills now, so a request admitted after it in the same
            # step finds them: each layer stores the whole batch's K/V before any attention
            # reads it, so the reader sees them written (a cheap test per request per step).
            bm.cache_full_blocks(req, req.num_computed_tokens + num_new)
        if num_new == 1 and req.num_tokens - req.num_computed_tokens == 1:
            batch.requests.insert(batch.num_decodes, req)
            batch.num_new_tokens.insert(batch.num_decodes, num_new)
            batch.num_decodes += 1
        else:  # a prefill chunk, or a decode with drafts (several query tokens)
            batch.requests.append(req)
            batch.num_new_tokens.append(num_new)
            if not req.spec_tokens:
                req.metrics.num_prefill_chunks += 1
                req.record("prefill_chunk", tokens=num_new, start=req.num_computed_tokens)
        if req.metrics.first_scheduled_time is None:
            req.metrics.first_scheduled_time = time.time()
            req.record("scheduled")

    def advance(self, batch: ScheduledBatch) -> None:
        """The step is launched: advance computed counts, and give each sampling request a
        placeholder for its token (so the next step can be scheduled before it comes back)."""
        sampling = batch.sampling_indices
        for req, num_new in zip(batch.requests, batch.num_new_tokens):
            req.num_computed_tokens += num_new
        for i in sampling:
            batch.requests[i].append_placeholder()

    def resolve(
        self, batch: ScheduledBatch, sampled: dict[int, tuple[int, object]]
    ) -> list[Request]:
        """The step's tokens came back (index -> (token, logprob)): fill the placeholders,
        apply the stop rules and release requests that finished. Requests that finished
        meanwhile (a stop, an abort) ignore theirs. Returns the requests that got a token."""
        touched = []
        for i, (token, logprob) in sampled.items():
            req = batch.requests[i]
            if req.is_finished:
                continue
            req.append_token(token, logprob)
            touched.append(req)
            if req.is_finished:
                self._release(req)
            elif req.num_computed_tokens // self.block_manager.block_size > len(req.block_keys):
                self.block_manager.cache_full_blocks(req)
        return touched
