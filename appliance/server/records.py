"""RequestRecord: one HTTP request's life as the server saw it (ids, counts, timings, trace).

Handlers fill it in as the request advances; /v1/requests/{id}, /v1/stats, the metrics and
the request log all read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.scheduling.request import RequestOutput
from engine.structured import KINDS

STRUCTURED_KINDS = (*KINDS, "tool_call")
"""What a request's output can be held to: the engine's grammar kinds, and "tool_call" for a
call forced by `tool_choice` ("required" or a named function)."""


@dataclass
class ChoiceRecord:
    """One engine sub-request (one choice of one prompt)."""

    index: int
    engine_id: str
    prompt_index: int
    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens whose KV the engine found in its prefix cache when it admitted the choice."""
    finish_reason: str | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    queue_s: float | None = None
    num_preemptions: int = 0
    num_images: int = 0
    encoder_s: float = 0.0
    """Seconds of vision-encoder steps that encoded its images."""
    engine_trace: list[dict] = field(default_factory=list)

    def update(self, output: RequestOutput, now: float) -> int:
        """Take in an output; returns how many new tokens it brought."""
        new = len(output.token_ids) - self.completion_tokens
        if new > 0 and self.first_token_at is None:
            self.first_token_at = now
        self.completion_tokens = len(output.token_ids)
        self.cached_tokens = output.num_cached_tokens
        m = output.metrics
        if m.first_scheduled_time is not None:
            self.queue_s = max(0.0, m.first_scheduled_time - m.arrival_time)
        self.num_preemptions = m.num_preemptions
        self.num_images, self.encoder_s = m.num_images, m.encoder_s
        if output.finished:
            self.finish_reason = output.finish_reason
            self.finished_at = now
            self.engine_trace = [
                {"time": e.time, "event": e.event, **({"detail": e.detail} if e.detail else {})}
                for e in output.trace
            ]
        return max(0, new)

    @property
    def grammar(self) -> dict | None:
        """The engine's account of this choice's grammar (kind, compile_ms, mask_steps,
        mask_ms_mean, mask_ms_max, tokens_accepted), from its trace; None when unconstrained
        or not finished."""
        for e in reversed(self.engine_trace):
            if e["event"] == "grammar":
                return e.get("detail")
        return None

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_at is None or self.finished_at is None or self.completion_tokens < 2:
            return None
        return (self.finished_at - self.first_token_at) / (self.completion_tokens - 1)


@dataclass
class RequestRecord:
    """One HTTP request; `status` is queued, running, finished, error, timeout or cancelled."""

    request_id: str
    endpoint: str
    model: str
    key_name: str | None = None
    stream: bool = False
    received_at: float = field(default_factory=time.time)
    status: str = "queued"
    http_status: int | None = None
    error: str | None = None
    finished_at: float | None = None
    choices: list[ChoiceRecord] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    structured: str | None = None
    """The grammar kind the output is held to (one of STRUCTURED_KINDS); None: unconstrained."""
    tools: bool = False
    """The request sent tools."""
    grammar_compile_s: float | None = None
    """How long the front end's check of the request's grammar took (a compile)."""
    sampling: dict | None = None
    """The effective sampling values (after the model's defaults and the overrides) and where
    each defaulted one came from (appliance.server.protocol.effective_params)."""

    def event(self, name: str, **detail) -> None:
        self.events.append(
            {"time": time.time(), "event": name, **({"detail": detail} if detail else {})}
        )

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens counted once per prompt (choices of one prompt share it)."""
        seen: dict[int, int] = {}
        for c in self.choices:
            seen.setdefault(c.prompt_index, c.prompt_tokens)
        return sum(seen.values())

    @property
    def cached_tokens(self) -> int:
        """Of prompt_tokens, those found in the prefix cache: per prompt, the fewest any of its
        choices found (so n > 1 choices that hit the blocks their first choice just computed do
        not make a new prompt look cached)."""
        seen: dict[int, int] = {}
        for c in self.choices:
            seen[c.prompt_index] = min(seen.get(c.prompt_index, c.cached_tokens), c.cached_tokens)
        return sum(seen.values())

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    @property
    def ttft_s(self) -> float | None:
        firsts = [c.first_token_at for c in self.choices if c.first_token_at is not None]
        return min(firsts) - self.received_at if firsts else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.received_at

    def close(self, status: str, http_status: int, error: str | None = None) -> None:
        self.status, self.http_status, self.error = status, http_status, error
        self.finished_at = time.time()
        self.event("closed", status=status, http_status=http_status)

    def summary(self) -> dict:
        """One row of the request table."""
        queue = [c.queue_s for c in self.choices if c.queue_s is not None]
        tpots = [c.tpot_s for c in self.choices if c.tpot_s is not None]
        return {
            "id": self.request_id,
            "endpoint": self.endpoint,
            "state": self.status,
            "http_status": self.http_status,
            "received_at": self.received_at,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "n": len(self.choices),
            "queue_s": max(queue) if queue else None,
            "ttft_s": self.ttft_s,
            "tpot_s": sum(tpots) / len(tpots) if tpots else None,
            "e2e_s": self.e2e_s,
            "num_preemptions": sum(c.num_preemptions for c in self.choices),
            "images": max((c.num_images for c in self.choices), default=0),
            "encoder_s": sum(c.encoder_s for c in self.choices),
            "finish_reasons": [c.finish_reason for c in self.choices],
            "error": self.error,
            "structured": self.structured,
            "tools": self.tools,
            "grammar_compile_s": self.grammar_compile_s,
        }

    def trace(self) -> dict:
        """The full trace: server events and each choice's engine events, in time order."""
        events = [{**e, "source": "server"} for e in self.events]
        for c in self.choices:
            events += [{**e, "source": "engine", "choice": c.index} for e in c.engine_trace]
        events.sort(key=lambda e: e["time"])
        for e in events:
            e["t_ms"] = round((e["time"] - self.received_at) * 1000, 3)
        return {
            **self.summary(),
            "key_name": self.key_name,
            "stream": self.stream,
            "sampling": self.sampling,
            "choices": [
                {
                    "index": c.index,
                    "engine_id": c.engine_id,
                    "prompt_tokens": c.prompt_tokens,
                    "cached_tokens": c.cached_tokens,
                    "completion_tokens": c.completion_tokens,
                    "finish_reason": c.finish_reason,
                    "queue_s": c.queue_s,
                    "tpot_s": c.tpot_s,
                    "num_preemptions": c.num_preemptions,
                    "grammar": c.grammar,
                }
                for c in self.choices
            ],
            "events": events,
        }
