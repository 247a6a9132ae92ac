"""The one boundary type: a Request crosses engine -> scheduler -> block manager -> runner.

It carries the ids, the KV block table, the sampling params, the status and the trace. Nothing
else crosses those boundaries.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.multimodal import ImageInput
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import salted_root
from engine.structured.grammar_state import Verdict

PLACEHOLDER = -1
"""Stands in token_ids for a token sampled on the device but not read back yet (overlap)."""


def check_prompt(
    token_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int
) -> None:
    """ValueError, saying what to change, for a prompt that is empty, holds a token id outside
    the vocabulary, or asks for more tokens in all than max_model_len."""
    if not token_ids:
        raise ValueError("the prompt is empty: send at least one token")
    bad = [t for t in token_ids if not (isinstance(t, int) and 0 <= t < vocab_size)]
    if bad:
        raise ValueError(f"prompt token ids must be integers in [0, {vocab_size}); got {bad[:5]}")
    if params.pooling is not None:
        if len(token_ids) > max_model_len:
            raise ValueError(
                f"This model's maximum context length is {max_model_len} tokens; the input has "
                f"{len(token_ids)}. Shorten it."
            )
        return
    total = len(token_ids) + params.max_tokens
    if total > max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens; the request asks "
            f"for {total} ({len(token_ids)} in the prompt, {params.max_tokens} to generate). "
            "Shorten the prompt or lower max_tokens."
        )


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset(
    (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)
)


@dataclass
class TraceEvent:
    """One timestamped step of a request's life (arrival, queued, prefill chunk, ...)."""

    time: float
    event: str
    detail: dict = field(default_factory=dict)


@dataclass
class RequestMetrics:
    """Timestamps (time.time()) and counters of one request."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    num_prefill_chunks: int = 0
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache at the first admission."""
    num_draft_tokens: int = 0
    """Speculative decoding: drafted tokens verified for this request."""
    num_accepted_tokens: int = 0
    """Of those, accepted."""
    num_images: int = 0
    """Images in the prompt (engine.multimodal)."""
    encoder_s: float = 0.0
    """Seconds of vision-encoder steps that encoded its images."""

    def snapshot(self) -> RequestMetrics:
        """A copy for readers on other threads (4x cheaper than copy.copy)."""
        copied = object.__new__(RequestMetrics)
        copied.__dict__.update(self.__dict__)
        return copied


@dataclass
class Logprob:
    """The chosen token's log-probability and the top alternatives at that step."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class RequestOutput:
    """What a caller sees of a request: cumulative tokens and text so far, or final."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    metrics: RequestMetrics
    logprobs: list[Logprob] | None = None
    stop_reason: str | int | None = None
    trace: list[TraceEvent] = field(default_factory=list)
    pooled: list[float] | None = None
    """A pooling request's vector (SamplingParams.pooling): the embedding, or [score]."""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens whose KV came from the prefix cache (0: none, or caching off)."""
        return self.metrics.num_cached_tokens


class Request:
    """A request and its sequence state. Owned by the engine thread."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        seed: int,
        eos_token_ids: frozenset[int] = frozenset(),
        arrival_time: float | None = None,
        images: list[ImageInput] | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.has_penalties = params.has_penalties
        """Read every step (sampling, overlap): computed once, params never change."""
        self.seed = seed
        """Effective seed: the request's own, or one drawn from the engine's seed."""
        self.eos_token_ids = eos_token_ids
        self.token_ids: list[int] = list(prompt_token_ids)
        """Prompt followed by the generated tokens."""
        self.status = RequestStatus.WAITING
        self.block_table: list[int] = []
        self.block_keys: list[bytes] = []
        """Prefix-cache keys of the first len(block_keys) blocks
        (engine.scheduling.block_manager)."""
        self.root_key = salted_root(params.cache_salt)
        """The parent key of the first block: the request's prefix-cache namespace."""
        self.images: list[ImageInput] = sorted(images or [], key=lambda i: i.offset)
        """The prompt's images, in prompt order (engine.multimodal)."""
        self.mrope = None
        """(positions [3, prompt length] int64, delta) of a model with multimodal RoPE given
        images (Qwen3.5): a prompt token's (temporal, height, width) positions, and the offset
        a later token at index i takes (position i + delta); None: positions are indices."""
        self.images_encoded: set[bytes] = set()
        """Hashes of its images whose encoder rows are computed (or scheduled to be): the
        runner keeps them while the request lives, preempted or not."""
        self.num_computed_tokens = 0
        """Tokens whose K/V is in the cache."""
        self.state_slot: int | None = None
        """The state-pool slot of a model with linear-attention layers
        (engine/memory/state_pool.py), held from admission until finish, abort or preemption."""
        self.num_pending = 0
        """Sampled tokens not read back from the device yet: the last num_pending entries of
        token_ids are PLACEHOLDER (an overlapped step launched before its tokens came back)."""
        self.logprobs: list[Logprob] | None = [] if params.logprobs is not None else None
        self.stop_reason: str | int | None = None
        self.spec_tokens: list[int] = []
        """Drafted tokens to verify this step after the last token (engine/spec/step.py); the
        scheduler trims them to the step's budget and the free KV blocks."""
        self.pooled: list[float] | None = None
        """A pooling request's vector, set when its prefill ends (it then finishes)."""
        self.grammar = None
        """The request's GrammarState (engine.structured) once compiled; None = unconstrained."""
        now = time.time() if arrival_time is None else arrival_time
        self.metrics = RequestMetrics(arrival_time=now, num_images=len(self.images))
        self.trace: list[TraceEvent] = [TraceEvent(now, "arrived")]

    # --- derived sizes -------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def has_images_ahead(self) -> bool:
        """Some image's placeholders are not computed yet (the scheduler and the runner look at
        its images only then: a decode past the prompt costs nothing more)."""
        return bool(self.images) and self.images[-1].end > self.num_computed_tokens

    @property
    def is_pooling(self) -> bool:
        """An embedding or scoring request (SamplingParams.pooling): it samples nothing."""
        return self.params.pooling is not None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Sampled tokens, pending ones included (the index of the next token to sample)."""
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens read back so far (pending placeholders excluded)."""
        return self.token_ids[len(self.prompt_token_ids) : len(self.token_ids) - self.num_pending]

    @property
    def is_awaiting_last_token(self) -> bool:
        """Every token it may generate is sampled, some still pending: nothing left to run."""
        return self.num_pending > 0 and self.num_output_tokens >= self.params.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.is_finished else None

    # --- life cycle ----------------------------------------------------------------------
    def record(self, event: str, **detail) -> None:
        self.trace.append(TraceEvent(time.time(), event, detail))

    def append_placeholder(self) -> None:
        """Reserve the slot of a token sampled on the device but not read back yet."""
        self.token_ids.append(PLACEHOLDER)
        self.num_pending += 1

    def append_token(self, token_id: int, logprob: Logprob | None = None) -> None:
        """Add a sampled token (into the oldest placeholder, if any) and apply the token-level
        stop rules (EOS, stop ids, length)."""
        if self.num_pending:
            self.token_ids[len(self.token_ids) - self.num_pending] = token_id
            self.num_pending -= 1
        else:
            self.token_ids.append(token_id)
        if self.logprobs is not None and logprob is not None:
            self.logprobs.append(logprob)
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = time.time()
            self.record("first_token")
        params = self.params
        if self.grammar is not None and self._grammar_ends(token_id):
            return
        if not params.ignore_eos and token_id in self.eos_token_ids:
            self.stop_reason = None
            self.finish(RequestStatus.FINISHED_STOPPED)
        elif token_id in params.stop_token_ids:
            self.stop_reason = token_id
            self.finish(RequestStatus.FINISHED_STOPPED)
        elif self.num_output_tokens - self.num_pending >= params.max_tokens:
            self.finish(RequestStatus.FINISHED_LENGTH)

    def truncate_output(self, num_output: int) -> None:
        """Keep the first num_output generated tokens (a stop string ended the text inside a
        step that emitted several: the tokens after it were never generated). A request a
        dropped token finished (EOS, length) finished on the stop string instead."""
        end = self.num_prompt_tokens + num_output
        if end >= len(self.token_ids) - self.num_pending:
            return
        del self.token_ids[end:]
        self.num_pending = 0
        if self.logprobs is not None:
            del self.logprobs[num_output:]
        if self.is_finished:
            self.status = RequestStatus.FINISHED_STOPPED

    def _grammar_ends(self, token_id: int) -> bool:
        """Advance the grammar; True when it ended the request (complete, or refused)."""
        verdict = self.grammar.accept(token_id)
        if verdict is Verdict.GOING:
            return False
        if verdict is Verdict.REFUSED:
            self.record("grammar_refused", token=token_id)
        self.stop_reason = None
        self.finish(RequestStatus.FINISHED_STOPPED)
        return True

    def finish(self, status: RequestStatus) -> None:
        """End the request; tokens still pending are dropped (sampled after the end)."""
        if self.num_pending:
            del self.token_ids[-self.num_pending :]
            self.num_pending = 0
        if self.status.is_finished:
            return
        self.status = status
        self.metrics.finished_time = time.time()
        if self.grammar is not None:
            self.record("grammar", **self.grammar.summary())
        if self.metrics.num_draft_tokens:
            m = self.metrics
            self.record("spec", drafted=m.num_draft_tokens, accepted=m.num_accepted_tokens)
        self.record("finished", reason=status.value)
