"""SamplingParams: how one request picks tokens, when it stops, and whose it is (the scheduler's
priority class and fair share)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.structured.structured_output import StructuredOutput

MAX_CACHE_SALT = 256
"""Longest cache_salt, in characters."""
PRIORITIES = ("interactive", "batch")
"""Priority classes, the first served first (engine/scheduling/scheduling_policy.py orders the
waiting queue)."""


POOLING_TASKS = ("embed", "score")
"""What a pooling request returns (SamplingParams.pooling)."""


@dataclass
class SamplingParams:
    """Per-request sampling and stopping settings (OpenAI/vLLM names)."""

    max_tokens: int = 16
    """Most tokens to generate."""
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 (or 0) = all."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p x the top probability."""
    repetition_penalty: float = 1.0
    """> 1 discourages tokens already in the prompt or output (divides positive logits)."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token already generated."""
    frequency_penalty: float = 0.0
    """Subtracted per occurrence from the logit of tokens already generated."""
    seed: int | None = None
    """Same seed -> same tokens, whatever else is in the batch."""
    stop: list[str] = field(default_factory=list)
    """Stop strings; the output is cut before the first one."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra token ids that end the request."""
    ignore_eos: bool = False
    """Keep generating past the model's end-of-sequence token."""
    logprobs: int | None = None
    """Return the chosen token's logprob plus this many top alternatives (0 = chosen only)."""
    skip_special_tokens: bool = True
    """Drop special tokens from the text."""
    structured: StructuredOutput | None = None
    """Constrain the output to a JSON schema, regex, choice or grammar (engine.structured)."""
    priority: str = "interactive"
    """Priority class, one of PRIORITIES: waiting batch requests yield to interactive ones."""
    client: str | None = None
    """Who sent the request (an API key's name): the scheduler shares the GPU fairly between
    clients of one class. None: the anonymous client."""
    share_weight: float = 1.0
    """The client's weight in the fair share: a client of weight 2 is served as if it had
    used half the tokens it did (its API key's `weight`)."""
    cache_salt: str | None = None
    """Prefix-cache namespace: the request only hits blocks cached by requests with the same
    salt (None: the shared one). Keeps one team's prompts from being probed by another's."""
    pooling: str | None = None
    """None: generate. One of POOLING_TASKS: run the prompt's prefill only and return a vector
    (engine/runner/pooler.py): "embed" the embedding, "score" the reranker's relevance."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.pooling is not None and self.pooling not in POOLING_TASKS:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_TASKS)}")
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is None or self.top_k == 0:
            self.top_k = -1
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (all) or a positive integer, got {self.top_k!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.priority not in PRIORITIES:
            raise ValueError(
                f"priority must be one of {', '.join(PRIORITIES)}, got {self.priority!r}"
            )
        if not (isinstance(self.share_weight, int | float) and self.share_weight > 0):
            raise ValueError(f"share_weight must be a positive number, got {self.share_weight!r}")
        if self.cache_salt is not None and not (
            isinstance(self.cache_salt, str) and 0 < len(self.cache_salt) <= MAX_CACHE_SALT
        ):
            raise ValueError(f"cache_salt must be a string of 1 to {MAX_CACHE_SALT} characters")
        if isinstance(self.structured, dict):  # as it crosses the wire
            self.structured = StructuredOutput(**self.structured)

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
