"""The adaptive choice of the number of drafted tokens k (0 = off) for each step, from measured
step costs and running acceptance rates.

With per-token acceptance a (drafts accepted independently until the first rejection), a
sequence that drafts k tokens emits E(a, k) = (1 - a^(k+1)) / (1 - a) tokens per step (k + 1 at
a = 1; 1 at k = 0). A step of batch b at k costs cost(b, k) seconds (the verify forward, plus
the drafter's own time where it has one), so the policy picks the k that maximises

    sum over the batch of E(a_r, k_r) / cost(b, k)

where k_r = k for requests still drafting and 0 for the others. At batch 1 the forward reads
the weights either way, so k > 0 wins from a modest a; at a large batch the forward is
compute-bound, cost(b, k) grows like k + 1 while E grows slower, and k = 0 wins: speculation
turns itself off under load because the measured table says so.

Acceptance is an exponential average per drafter and per request: drafted tokens checked and
accepted, both decayed per update (by `decay` for a request, by `drafter_decay` for a drafter,
which is updated once per request per step). A request's rate starts at its drafter's rate,
worth `prior_weight` checked tokens that decay like a measurement, or from PROBE_RATE where
that is higher (so every request tries). A request whose rate stays below `floor` stops
drafting for `retry_after` steps, then starts again from that first guess.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_FIRST_GUESS = 0.5
"""A drafter's acceptance before it has any measurement (replaced within a few steps)."""
PROBE_RATE = 0.7
"""The least rate a new request starts from, worth prior_weight checked tokens: it drafts
where a step would pay at that rate until its own verifications say otherwise. Without it a
drafter that did badly on earlier requests (free chat) would keep every later request from
drafting (a document to quote), and its rate, fed only by drafting requests, would never
change again. The price on a request that does not pay: its first verification or two."""


def expected_tokens(a: float, k: int) -> float:
    """Tokens a sequence emits per step with k drafts accepted i.i.d. with probability a."""
    if k == 0:
        return 1.0
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


class CostTable:
    """Measured seconds of one step by (batch size, k); k = 0 is the plain decode step (or,
    for a drafter's own table, no drafting: 0 seconds).

    Between measured batch sizes the cost is interpolated linearly; below the smallest it is the
    smallest's; above the largest it grows in proportion to the batch (the compute-bound
    extreme: never cheaper than the truth).
    """

    def __init__(self, seconds: Mapping[tuple[int, int], float]) -> None:
        if not seconds:
            raise ValueError("the cost table is empty: measure at least (batch, k=0) steps")
        by_k: dict[int, dict[int, float]] = {}
        for (batch, k), cost in seconds.items():
            if batch < 1 or k < 0 or not cost >= 0:
                raise ValueError(
                    f"cost table entry ({batch}, {k}): {cost} needs batch >= 1, k >= 0 and "
                    "seconds >= 0"
                )
            by_k.setdefault(k, {})[batch] = float(cost)
        if 0 not in by_k:
            raise ValueError("the cost table has no k = 0 entries (the step without drafts)")
        self._batches = {k: sorted(costs) for k, costs in by_k.items()}
        self._costs = by_k
        self.min_seconds = min(seconds.values())

    def entries(self) -> dict[tuple[int, int], float]:
        """The measured seconds by (batch, k), as given."""
        return {(b, k): s for k, costs in self._costs.items() for b, s in costs.items()}

    @property
    def ks(self) -> list[int]:
        """The draft lengths measured, ascending (0 first)."""
        return sorted(self._costs)

    def cost(self, batch: int, k: int) -> float:
        """Seconds of a step of `batch` sequences drafting k tokens each."""
        if k not in self._costs:
            raise KeyError(f"k = {k} was not measured (measured: {self.ks})")
        batches, costs = self._batches[k], self._costs[k]
        if batch <= batches[0]:
            return costs[batches[0]]
        if batch >= batches[-1]:
            return costs[batches[-1]] * batch / batches[-1]
        i = bisect_left(batches, batch)
        lo, hi = batches[i - 1], batches[i]
        if hi == batch:
            return costs[hi]
        w = (batch - lo) / (hi - lo)
        return costs[lo] * (1 - w) + costs[hi] * w


class Acceptance:
    """An exponentially decayed acceptance rate: accepted / checked drafted tokens, starting
    from a prior worth `prior_weight` checked tokens (which decays like any measurement)."""

    def __init__(self, decay: float, prior: float, prior_weight: float) -> None:
        self.decay = decay
        self.accepted = prior * prior_weight
        self.checked = prior_weight
        self.num_updates = 0

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """One verification: the drafts up to the first rejection were checked (all of them when
        every one was accepted)."""
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"accepted {num_accepted} of {num_drafted} drafts: impossible")
        if num_drafted == 0:
            return
        checked = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.accepted = self.decay * self.accepted + num_accepted
        self.checked = self.decay * self.checked + checked
        self.num_updates += 1

    @property
    def rate(self) -> float:
        return self.accepted / self.checked


@dataclass
class Decision:
    """The policy's choice for one step."""

    k: int
    """Drafts per drafting request (0 = speculation off this step)."""
    per_request: list[int]
    """k or 0 for each request, in the order given."""
    tokens_per_s: float
    """Expected output tokens per second at this k."""
    tokens_per_s_off: float
    """The same without speculation."""


@dataclass
class _RequestState:
    acceptance: Acceptance
    drafter: str
    off_until: int = -1
    """Step number before which the request does not draft."""


class SpecPolicy:
    """Chooses k per step; fed with each verification's drafted and accepted counts."""

    def __init__(
        self,
        costs: CostTable,
        *,
        draft_costs: CostTable | None = None,
        max_k: int | None = None,
        decay: float = 0.9,
        drafter_decay: float = 0.99,
        prior_weight: float = 2.0,
        floor: float = 0.1,
        min_updates: int = 4,
        retry_after: int = 64,
        probe_rate: float = PROBE_RATE,
    ) -> None:
        """draft_costs: the drafter's own seconds by (batch, k) (None: free, as n-gram lookup).
        max_k: the largest k to choose (None: the largest measured). floor: a request below
        this rate after min_updates verifications stops drafting for retry_after steps (at
        a = 0.1 drafts add at most a / (1 - a) = 0.11 tokens a step). probe_rate: the least
        rate a new request starts from (see PROBE_RATE)."""
        if not (0 < decay < 1 and 0 < drafter_decay < 1):
            raise ValueError(f"decays must be in (0, 1), got {decay} and {drafter_decay}")
        if not 0 <= floor < 1:
            raise ValueError(f"floor must be in [0, 1), got {floor}")
        if prior_weight <= 0 or min_updates < 1 or retry_after < 1:
            raise ValueError("prior_weight must be > 0, min_updates and retry_after >= 1")
        if costs.min_seconds <= 0:
            raise ValueError("every step in the cost table must take a positive time")
        self.costs, self.draft_costs = costs, draft_costs
        self.ks = [k for k in costs.ks if max_k is None or k <= max_k]
        if draft_costs is not None:
            self.ks = [k for k in self.ks if k == 0 or k in draft_costs.ks]
        self.decay, self.drafter_decay = decay, drafter_decay
        self.prior_weight, self.floor = prior_weight, floor
        self.min_updates, self.retry_after = min_updates, retry_after
        self.probe_rate = probe_rate
        self.step = 0
        self._drafters: dict[str, Acceptance] = {}
        self._requests: dict[str, _RequestState] = {}

    # --- measurements ----------------------------------------------------------------------
    def observe(self, request_id: str, drafter: str, num_drafted: int, num_accepted: int) -> None:
        """Record one verification of a request's drafts."""
        self._drafter(drafter).update(num_drafted, num_accepted)
        state = self._request(request_id, drafter)
        state.acceptance.update(num_drafted, num_accepted)
        if (
            state.acceptance.num_updates >= self.min_updates
            and self.request_rate(request_id) < self.floor
        ):
            state.off_until = self.step + self.retry_after
            state.acceptance = self._fresh(drafter)  # retried from the drafter's rate

    def release(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def drafter_rate(self, drafter: str) -> float:
        return self._drafter(drafter).rate

    def request_rate(self, request_id: str) -> float:
        return self._requests[request_id].acceptance.rate

    def is_drafting(self, request_id: str) -> bool:
        state = self._requests.get(request_id)
        return state is None or self.step >= state.off_until

    # --- the choice ------------------------------------------------------------------------
    def choose(self, request_ids: Sequence[str], drafter: str, others: int = 0) -> Decision:
        """k for a step over these requests (call once per step: it advances the step count).
        others: sequences in the same step that cannot draft (one token each, but they count
        in the batch size the step costs by)."""
        self.step += 1
        batch = len(request_ids) + others
        if not request_ids:
            return Decision(0, [], 0.0, 0.0)
        off = batch / self.costs.cost(batch, 0)
        # Where no k would pay even with every draft accepted (a compute-bound batch), k = 0
        # without a pass over the requests: the step loop asks every step.
        best_case = (others + len(request_ids) * (k + 1) for k in self.ks)
        if not any(k and t / self._seconds(batch, k) > off for k, t in zip(self.ks, best_case)):
            return Decision(0, [0] * len(request_ids), off, off)
        drafting = [self.is_drafting(r) for r in request_ids]
        rates = [
            self.request_rate(r) if r in self._requests else self.first_guess(drafter)
            for r in request_ids
        ]
        best = None
        for k in self.ks:
            tokens = others + sum(
                expected_tokens(a, k) if on else 1.0 for a, on in zip(rates, drafting)
            )
            rate = tokens / self._seconds(batch, k)
            if best is None or rate > best[1]:  # ties keep the smaller k
                best = (k, rate)
        k, rate = best
        return Decision(k, [k if on else 0 for on in drafting], rate, off)

    def _seconds(self, batch: int, k: int) -> float:
        """A step's cost at k: the verify step's, plus the drafter's own where it has one."""
        seconds = self.costs.cost(batch, k)
        if k and self.draft_costs is not None:
            seconds += self.draft_costs.cost(batch, k)
        return seconds

    def _drafter(self, name: str) -> Acceptance:
        if name not in self._drafters:
            first = Acceptance(self.drafter_decay, DEFAULT_FIRST_GUESS, self.prior_weight)
            self._drafters[name] = first
        return self._drafters[name]

    def first_guess(self, drafter: str) -> float:
        """A new request's starting rate: its drafter's, or probe_rate where that is higher."""
        return max(self.drafter_rate(drafter), self.probe_rate)

    def _fresh(self, drafter: str) -> Acceptance:
        return Acceptance(self.decay, self.first_guess(drafter), self.prior_weight)

    def _request(self, request_id: str, drafter: str) -> _RequestState:
        if request_id not in self._requests:
            self._requests[request_id] = _RequestState(self._fresh(drafter), drafter)
        return self._requests[request_id]
