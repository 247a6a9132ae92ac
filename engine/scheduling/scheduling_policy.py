"""Scheduling policy: the order of the waiting queue, the preemption victim, and the share of a
step's token budget that long prompts may take while short ones wait. Knows requests and their
SamplingParams (priority, client), nothing of HTTP.

Rank of a waiting request (`SchedulingPolicy.rank`, lower first):

1. The oldest aged request first: the one that arrived first among those that have waited
   `queue_aging_s` seconds (its "anchor" turn). One at a time: other aged requests keep their
   rank below until they are the oldest, so a batch flood that has waited longer than
   `queue_aging_s` lets one request at a time ahead of interactive ones, not all of them.
2. Then the others, by
   a. priority class, in PRIORITIES order (interactive before batch);
   b. a request preempted by recompute before one never admitted (it held a place once);
   c. fair share: its client's tokens served recently (each scheduled token counts 1, decayed
      by exp(-age / fair_share_window_s)) over the client's weight (share_weight), fewest
      first;
   d. short first: a short prompt before a long one (defined below), so that short requests
      are not stuck behind long ones; among short (or long) ones, arrival order.
   Ties keep the queue's order (arrival; preempted requests at its head).

The bound aging gives: once a request is the oldest aged one, no request is admitted before it
(see `Scheduler._admit_waiting`): not when it does not fit the KV pool, and the long-prompt
share does not hold it back; running requests end (their output is bounded by max_tokens), so
their blocks and seats come back. A request becomes the oldest aged one once it has waited
`queue_aging_s` and every request that arrived before it has been admitted, so it waits at most
`queue_aging_s` plus the time to serve those and the requests running meanwhile; no mix of
later classes, clients or lengths can hold it longer.

Long prompts: a prompt is long when more than `long_prompt_tokens` of its tokens remain to
compute (unset: more than `long_prompt_share` of the step's token budget, i.e. a chunk the cap
below would cut). While a short request waits and a seat is free for it, the chunks of long
prompts together take at most `long_prompt_share` of the step's budget, so the short request
is admitted beside them in the next step instead of after them. With no short request
waiting, a long prompt takes the whole budget (no throughput is lost when it is alone).

Preemption under KV pressure takes the batch class first, then the most recently admitted; a
request never preempts one of a higher class (it preempts itself instead).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence

from engine.config import EngineConfig
from engine.sampling_params import PRIORITIES
from engine.scheduling.request import Request

CLASS_RANK = {name: i for i, name in enumerate(PRIORITIES)}
"""Priority class -> rank (0 first), from PRIORITIES' order."""


class FairShare:
    """Tokens served per client, decayed exponentially with time constant window_s: a token
    served window_s ago counts 1/e, one served 3 * window_s ago about 5%."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._served: dict[str | None, tuple[float, float]] = {}
        """client -> (decayed tokens, when that value was computed)."""

    def usage(self, client: str | None, now: float) -> float:
        value, at = self._served.get(client, (0.0, now))
        return value * math.exp(-max(0.0, now - at) / self.window_s)

    def charge(self, client: str | None, num_tokens: int, now: float) -> None:
        self._served[client] = (self.usage(client, now) + num_tokens, now)
        if len(self._served) > 1024:  # forget clients whose usage has decayed to nothing
            self._served = {c: v for c, v in self._served.items() if self.usage(c, now) > 1e-3}


class SchedulingPolicy:
    """The scheduler's choices of order, victim and long-prompt share (see the module doc).

    `clock` returns seconds on the clock of Request.metrics.arrival_time (time.time); tests
    pass a fake one."""

    def __init__(self, config: EngineConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.fair_share = FairShare(config.fair_share_window_s)

    # --- order ---------------------------------------------------------------------------------
    def is_aged(self, req: Request, now: float) -> bool:
        return now - req.metrics.arrival_time >= self.config.queue_aging_s

    def oldest_aged(self, waiting: Iterable[Request], now: float) -> Request | None:
        """The request whose anchor turn it is: the first to arrive of those aged, or None."""
        aged = [r for r in waiting if self.is_aged(r, now)]
        return min(aged, key=lambda r: r.metrics.arrival_time) if aged else None

    def rank(
        self,
        req: Request,
        now: float,
        budget: int,
        usage: dict[str | None, float] | None = None,
        anchor: Request | None = None,
    ) -> tuple:
        """Sort key of a waiting request in a step of this token budget, lower first. usage:
        clients' fair-share usage at `now`, where already computed; anchor: the oldest aged
        request (see oldest_aged), which goes first."""
        if req is anchor:
            return (0, req.metrics.arrival_time)
        client = req.params.client
        served = usage[client] if usage is not None else self.fair_share.usage(client, now)
        return (
            1,
            CLASS_RANK[req.params.priority],
            req.metrics.num_preemptions == 0,
            served / req.params.share_weight,
            self.is_long(req, budget),
        )

    def order(self, waiting: Iterable[Request], budget: int) -> list[Request]:
        """The waiting requests in admission order for a step of this token budget (a stable
        sort: ties keep the queue's order)."""
        now = self.clock()
        waiting = list(waiting)
        usage = {c: self.fair_share.usage(c, now) for c in {r.params.client for r in waiting}}
        anchor = self.oldest_aged(waiting, now)
        return sorted(waiting, key=lambda r: self.rank(r, now, budget, usage, anchor))

    def charge(self, req: Request, num_tokens: int) -> None:
        """Count tokens scheduled for req against its client's fair share."""
        self.fair_share.charge(req.params.client, num_tokens, self.clock())

    # --- preemption ----------------------------------------------------------------------------
    def victim(self, req: Request, candidates: Sequence[Request]) -> Request:
        """Whom to preempt so that req gets its blocks: among candidates (running requests not
        scheduled this step, oldest admitted first) of req's class or a lower one, the lowest
        class, then the newest; req itself when there is none."""
        own = CLASS_RANK[req.params.priority]
        best, best_key = req, None
        for age, other in enumerate(candidates):
            cls = CLASS_RANK[other.params.priority]
            if other is req or cls < own:
                continue
            key = (cls, age)
            if best_key is None or key > best_key:
                best, best_key = other, key
        return best

    # --- long prompts --------------------------------------------------------------------------
    def long_cap(self, budget: int) -> int:
        """Tokens long prompts may take together in a step of this budget while short ones
        wait (at least 1)."""
        return max(1, math.floor(self.config.long_prompt_share * budget))

    def is_long(self, req: Request, budget: int) -> bool:
        threshold = self.config.long_prompt_tokens
        if threshold is None:
            threshold = self.long_cap(budget)
        return req.num_tokens - req.num_computed_tokens > threshold

    def long_allowance(self, budget: int, waiting: Iterable[Request]) -> int | None:
        """Tokens long prompts may take this step: long_cap while a short request waits,
        else None (no limit)."""
        if any(not self.is_long(r, budget) for r in waiting):
            return self.long_cap(budget)
        return None
