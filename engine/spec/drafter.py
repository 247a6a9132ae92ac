"""The drafter interface: what every source of drafted tokens (n-gram lookup, a draft model,
EAGLE-style heads) gives the verifier."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class DraftInput(Protocol):
    """What a drafter reads from a request (engine.scheduling.request.Request has these)."""

    request_id: str
    token_ids: list[int]
    """Prompt followed by the generated tokens; the last num_pending are placeholders."""
    num_pending: int


@dataclass
class Draft:
    """Up to k proposed tokens for one request."""

    token_ids: list[int]
    probs: torch.Tensor | None = None
    """[len(token_ids), vocab] the draft distribution q each token was drawn from (after the
    request's temperature and filters), or None when q is one-hot at the proposed token
    (a deterministic drafter such as n-gram lookup)."""

    def __post_init__(self) -> None:
        if self.probs is not None and self.probs.shape[0] != len(self.token_ids):
            raise ValueError(
                f"Draft.probs has {self.probs.shape[0]} rows for {len(self.token_ids)} tokens: "
                "give one distribution per drafted token"
            )


class Drafter(ABC):
    """Proposes tokens that the target model then verifies in one forward.

    A drafter may keep state per request (an index, a KV cache, hidden states): it is told when
    a request leaves through `release`. A draft model or EAGLE-style head would implement the
    same two calls, returning `Draft.probs` so that the verifier can use q(x).
    """

    name: str
    """Label for the acceptance statistics and the metrics (e.g. "ngram")."""
    needs_blocks: bool = False
    """True for a drafter that writes K/V at the draft positions (a draft model): the engine
    reserves k tokens per request before scheduling and calls `propose` after it, with each
    request's scheduled draft count (its blocks allocated), and every draft must be that long.
    False: `propose` runs before scheduling, which trims its drafts."""

    @abstractmethod
    def propose(self, requests: Sequence[DraftInput], k: int | Sequence[int]) -> list[Draft]:
        """At most k tokens (one k for all, or one per request; 0 = none) continuing each
        request's token_ids; fewer (or none) where the drafter has no good guess."""

    def release(self, request_id: str) -> None:  # noqa: B027 (stateless drafters keep nothing)
        """Forget a finished or aborted request's state."""


def per_request_k(requests: Sequence[DraftInput], k: int | Sequence[int]) -> list[int]:
    """Expand `k` to one non-negative count per request, with a clear error on a bad value."""
    ks = [k] * len(requests) if isinstance(k, int) else list(k)
    if len(ks) != len(requests):
        raise ValueError(f"got {len(ks)} draft lengths for {len(requests)} requests")
    if any(not isinstance(x, int) or x < 0 for x in ks):
        raise ValueError(f"draft lengths must be non-negative integers, got {ks}")
    return ks
