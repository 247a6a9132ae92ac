"""One request's grammar: its matcher, where the constrained part starts, and what it cost."""

from __future__ import annotations

import enum


def start_tokens(tokenizer, spec) -> tuple[tuple[int, ...] | None, int | None]:
    """(tokens that open the constrained part, a first token that defers it) of a spec: the
    arguments GrammarState takes after compile_s."""
    start_ids = open_id = None
    if spec.start_after:
        start_ids = tuple(tokenizer.encode(spec.start_after, add_special_tokens=False))
    if spec.reasoning_open:
        ids = tokenizer.encode(spec.reasoning_open, add_special_tokens=False)
        open_id = ids[0] if len(ids) == 1 else None
    return start_ids or None, open_id


class Verdict(enum.Enum):
    GOING = "going"
    DONE = "done"
    """The grammar is complete: the request ends with finish_reason "stop"."""
    REFUSED = "refused"
    """The token broke the grammar (only a token the mask did not choose can)."""


class GrammarState:
    def __init__(
        self,
        matcher,
        kind: str,
        compile_s: float,
        start_ids: tuple[int, ...] | None = None,
        open_id: int | None = None,
    ) -> None:
        """start_ids: the tokens that open the constrained part (None: it starts at once);
        open_id: a token that, as the first output token, defers the grammar to start_ids."""
        self.matcher = matcher
        self.kind = kind
        self.compile_s = compile_s
        self.start_ids = start_ids
        self.open_id = open_id if start_ids else None
        self.active = start_ids is None or open_id is not None
        self._tail: list[int] = []
        self.num_accepted = 0
        self.num_seen = 0
        self.mask_steps = 0
        self.mask_s_total = 0.0
        self.mask_s_max = 0.0

    @property
    def needs_mask(self) -> bool:
        return self.active

    @property
    def extra_allowed(self) -> int | None:
        """A token allowed beside the grammar's at this step (reasoning may open first)."""
        return self.open_id if self.num_seen == 0 else None

    def accept(self, token_id: int) -> Verdict:
        self.num_seen += 1
        if self.num_seen == 1 and token_id == self.open_id:
            self.active = False
            return Verdict.GOING
        if not self.active:
            self._tail = (self._tail + [token_id])[-len(self.start_ids) :]
            self.active = tuple(self._tail) == self.start_ids
            return Verdict.GOING
        if not self.matcher.accept(token_id):
            return Verdict.REFUSED
        self.num_accepted += 1
        return Verdict.DONE if self.matcher.is_terminated else Verdict.GOING

    def record_mask(self, seconds: float) -> None:
        self.mask_steps += 1
        self.mask_s_total += seconds
        self.mask_s_max = max(self.mask_s_max, seconds)

    def summary(self) -> dict:
        """For the request's trace: compile time and mask time per step."""
        steps = max(self.mask_steps, 1)
        return {
            "kind": self.kind,
            "compile_ms": round(self.compile_s * 1e3, 3),
            "mask_steps": self.mask_steps,
            "mask_ms_mean": round(self.mask_s_total / steps * 1e3, 4),
            "mask_ms_max": round(self.mask_s_max * 1e3, 4),
            "tokens_accepted": self.num_accepted,
        }
