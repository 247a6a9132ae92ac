"""Limiter: per-key admission in the front end (concurrency, requests and tokens per minute, the
max_tokens and context caps) and the OpenAI x-ratelimit-* headers that report it. No HTTP here:
a refusal is a Refusal (status, message, code, param, headers) that the routes answer.

Windows are sliding logs over the last WINDOW_S seconds. A request counts against its key's
RPM when admitted. Tokens count against TPM in two parts: the prompt when the request is
admitted (it must fit in what is left), the output when the request ends, however it ends
(finished, error, timeout, client gone), because only then is the count final. So one long
generation can take a key past its TPM; its next requests then wait until enough of the window
ages out, and Retry-After says when that is.

Headers follow OpenAI: `x-ratelimit-limit-*` the limit, `-remaining-*` what is left in the
window now, `-reset-*` how long until the window is back to its full limit ("1m0s", "12.5s",
"250ms"). Retry-After (whole seconds) is how long until the refused request would pass.
Each front-end process (--api-workers) keeps its own windows.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from appliance.key_limits import KeyLimits

WINDOW_S = 60.0
"""The RPM and TPM window."""
MAX_RETRY_AFTER_S = 60
"""Longest Retry-After given for a concurrency refusal (when a slot frees is a guess)."""


class Refusal(Exception):
    """A request the key's limits refuse: 429 (a rate limit) or 400 (a cap)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}


def duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: "250ms", "12.5s", "1m0s"."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 1):g}s"
    return f"{int(seconds // 60)}m{int(seconds % 60)}s"


@dataclass
class KeyUsage:
    """One key's limits and what it holds now: requests in flight, the windows' entries."""

    limits: KeyLimits
    running: int = 0
    requests: deque[float] = field(default_factory=deque)
    """Admission times within the window."""
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    """(time, tokens) charges within the window."""

    def prune(self, now: float) -> None:
        while self.requests and self.requests[0] <= now - WINDOW_S:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= now - WINDOW_S:
            self.tokens.popleft()

    @property
    def tokens_used(self) -> int:
        return sum(n for _, n in self.tokens)

    def tokens_free_in(self, needed: int, now: float) -> float:
        """Seconds until `needed` more tokens fit in the TPM window (0 when they fit now;
        `needed` must be at most the limit)."""
        excess = self.tokens_used + needed - self.limits.tpm
        if excess <= 0:
            return 0.0
        for at, n in self.tokens:
            excess -= n
            if excess <= 0:
                return max(0.0, at + WINDOW_S - now)
        return WINDOW_S


class Ticket:
    """One admitted request's hold on its key. `release` it at every ending (idempotent)."""

    def __init__(self, limiter: Limiter, usage: KeyUsage, admitted_at: float, prompt: int):
        self._limiter, self._usage = limiter, usage
        self._request = admitted_at
        self._prompt = (admitted_at, prompt)
        self.is_released = False

    def release(self, output_tokens: int) -> None:
        """The request ended having generated `output_tokens`: free its slot, charge them."""
        if self.is_released:
            return
        self.is_released = True
        self._usage.running -= 1
        if output_tokens > 0:
            self._usage.tokens.append((self._limiter.clock(), output_tokens))

    def refund(self) -> None:
        """The server refused the request after its key admitted it: undo everything."""
        if self.is_released:
            return
        self.is_released = True
        self._usage.running -= 1
        for log, entry in (
            (self._usage.requests, self._request),
            (self._usage.tokens, self._prompt),
        ):
            try:
                log.remove(entry)
            except ValueError:
                pass  # already aged out of the window


class Limiter:
    """Admission by key name: `admit` returns a Ticket or raises Refusal (429)."""

    def __init__(
        self,
        limits: dict[str, KeyLimits],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.usage = {name: KeyUsage(lim) for name, lim in limits.items()}
        self.clock = clock

    def limits(self, name: str) -> KeyLimits:
        return self.usage[name].limits

    def running(self, name: str) -> int:
        return self.usage[name].running

    def admit(self, name: str, prompt_tokens: int, retry_hint_s: float = 1.0) -> Ticket:
        """Admit one request of key `name` with `prompt_tokens`, or raise a 429 Refusal that
        names every limit it is past. `retry_hint_s`: Retry-After when only a free slot
        (max_concurrent) would let it pass (the server's mean request time is a good guess)."""
        u, now = self.usage[name], self.clock()
        self.check(name, retry_hint_s, prompt_tokens)
        u.running += 1
        u.requests.append(now)
        u.tokens.append((now, prompt_tokens))
        return Ticket(self, u, now, prompt_tokens)

    def check(self, name: str, retry_hint_s: float = 1.0, prompt_tokens: int = 0) -> None:
        """Raise the 429 Refusal `admit` would give (without admitting). With no prompt tokens:
        whether the key is past a limit already, checked before the prompt is tokenized."""
        u, now = self.usage[name], self.clock()
        u.prune(now)
        lim = u.limits
        if lim.tpm is not None and prompt_tokens > lim.tpm:
            raise Refusal(
                429,
                f"Request too large for key {name!r}: its prompt has {prompt_tokens} tokens and "
                f"the key's limit is {lim.tpm} tokens per minute; send a shorter prompt",
                "tokens_per_minute",
                headers=self.headers(name),
            )
        past = []  # (code, what, seconds until it would pass)
        if lim.max_concurrent is not None and u.running >= lim.max_concurrent:
            what = f"{lim.max_concurrent} concurrent requests ({u.running} in flight)"
            past.append(("concurrency_limit", what, min(MAX_RETRY_AFTER_S, retry_hint_s)))
        if lim.rpm is not None and len(u.requests) >= lim.rpm:
            wait = u.requests[0] + WINDOW_S - now
            past.append(("requests_per_minute", f"{lim.rpm} requests per minute", wait))
        if lim.tpm is not None and u.tokens_used + prompt_tokens > lim.tpm:
            this = f", {prompt_tokens} in this prompt" if prompt_tokens else ""
            what = f"{lim.tpm} tokens per minute ({u.tokens_used} used in the last minute{this})"
            past.append(("tokens_per_minute", what, u.tokens_free_in(prompt_tokens, now)))
        if past:
            retry = max(1, math.ceil(max(wait for _, _, wait in past)))
            raise Refusal(
                429,
                f"Rate limit reached for key {name!r}: limit "
                + "; ".join(what for _, what, _ in past)
                + f". Retry after {retry} s, or send fewer requests at once.",
                past[0][0] if len(past) == 1 else "rate_limit_exceeded",
                headers={**self.headers(name), "Retry-After": str(retry)},
            )

    def headers(self, name: str) -> dict[str, str]:
        """The key's x-ratelimit-* headers now (none for a key without RPM or TPM)."""
        u, now = self.usage[name], self.clock()
        u.prune(now)
        lim, out = u.limits, {}
        if lim.rpm is not None:
            reset = u.requests[-1] + WINDOW_S - now if u.requests else 0.0
            out["x-ratelimit-limit-requests"] = str(lim.rpm)
            out["x-ratelimit-remaining-requests"] = str(max(0, lim.rpm - len(u.requests)))
            out["x-ratelimit-reset-requests"] = duration(reset)
        if lim.tpm is not None:
            reset = u.tokens[-1][0] + WINDOW_S - now if u.tokens else 0.0
            out["x-ratelimit-limit-tokens"] = str(lim.tpm)
            out["x-ratelimit-remaining-tokens"] = str(max(0, lim.tpm - u.tokens_used))
            out["x-ratelimit-reset-tokens"] = duration(reset)
        return out


def capped_max_tokens(limits: KeyLimits, requested: int | None, prompt_len: int) -> int | None:
    """The max_tokens to ask for under the key's caps: `requested` when it is within them (a
    400 Refusal naming the cap when not); an omitted one (None) clamped to the max_tokens cap
    and to what the context cap leaves (None when the key has neither cap)."""
    cap, context = limits.max_tokens, limits.max_context
    if context is not None and prompt_len >= context:
        raise Refusal(
            400,
            f"the prompt has {prompt_len} tokens and this key's context cap (max_context) is "
            f"{context}; shorten the prompt",
            "context_cap_exceeded",
            param="messages",
        )
    if requested is None:
        room = [c for c in (cap, None if context is None else context - prompt_len) if c]
        return min(room) if room else None
    if cap is not None and requested > cap:
        raise Refusal(
            400,
            f"max_tokens {requested} is above this key's cap (max_tokens) of {cap}; ask for "
            f"at most {cap}",
            "max_tokens_cap_exceeded",
            param="max_tokens",
        )
    if context is not None and prompt_len + requested > context:
        raise Refusal(
            400,
            f"the request asks for {prompt_len + requested} tokens ({prompt_len} in the prompt, "
            f"{requested} to generate) and this key's context cap (max_context) is {context}; "
            f"ask for at most {context - prompt_len} tokens",
            "context_cap_exceeded",
            param="max_tokens",
        )
    return requested
