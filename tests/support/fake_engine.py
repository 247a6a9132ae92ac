"""A small, deterministic stand-in for LLMEngine (same public contract) for fast server tests.

Tokens are words "w<id>": text " w12 w57" encodes to [12, 57] and decodes back. Generated
tokens are a hash of (seed, prompt, position), so the same seed gives the same text. Prompt
markers steer behaviour: token 3 ("w3") makes a request stall after its first token, token 4
("w4") makes it end with EOS after three tokens, token 13 ("w13") counts one Triton compile
after warm-up (as a kernel built while serving would), token 14 ("w14") crashes the engine on
the step that admits it. The engine runs in the server's core process, so markers are how a
test steers it once the server started. KV blocks are reserved for prompt + max_tokens
at admission, so `kv_blocks_used` returns to 0 exactly when requests finish or are aborted.

Prefix caching (the config's `prefix_caching`, on by default) is modelled from outside, without
blocks: a request's first admission looks up its prompt's full blocks (block_size tokens,
chained keys) among those of earlier prompts and answers (LRU, at most num_kv_blocks), leaves
the last prompt token to compute, and reports what it found as the output's
`num_cached_tokens` (metrics.num_cached_tokens), a "prefix_cache_hit" trace event and the
stats' prefix_cache_* counters, as LLMEngine does.
"""

from __future__ import annotations

import random
import time
import zlib
from collections import OrderedDict, deque

import torch

from engine.config import EngineConfig
from engine.memory.bandwidth import BandwidthMeter
from engine.sampling_params import SamplingParams
from engine.scheduling.request import Logprob, RequestMetrics, RequestOutput, TraceEvent
from engine.spec.step import SpecCounters
from engine.text.tokenizer import apply_chat_template

VOCAB = 512
EOS_ID = 2
STALL_MARK = 3
EOS_MARK = 4
SCRIPT_CHARS = 3  # characters of a scripted output each token brings
COMPILE_MARK = 13
CRASH_MARK = 14


class FakeTokenizer:
    eos_token_id = EOS_ID
    chat_template = "role: content"

    def __len__(self) -> int:
        return VOCAB

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = []
        for word in text.split():
            if word.startswith("w") and word[1:].isdigit() and int(word[1:]) < VOCAB:
                ids.append(int(word[1:]))
            else:
                ids.append(16 + zlib.crc32(word.encode()) % (VOCAB - 16))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f" w{i}" for i in ids if not (skip_special_tokens and i == EOS_ID))

    def apply_chat_template(
        self, messages, tokenize=False, add_generation_prompt=True, tools=None, **variables
    ) -> str:
        """As a Hugging Face tokenizer renders its template (tokenize=False): the text, led by
        the names of the tools and the template variables when there are any."""
        head = [f"tools: {','.join(t['function']['name'] for t in tools)}"] if tools else []
        head += [f"{k}: {v}" for k, v in sorted(variables.items())]
        text = " ".join(head + [f"{m['role']}: {m.get('content')}" for m in messages])
        return text + (" assistant:" if add_generation_prompt else "")


class _Req:
    def __init__(self, rid: str, prompt: list[int], params: SamplingParams, seed: int, now: float):
        self.rid, self.prompt, self.params, self.seed = rid, prompt, params, seed
        self.out: list[int] = []
        self.logprobs: list[Logprob] | None = [] if params.logprobs is not None else None
        self.metrics = RequestMetrics(arrival_time=now)
        self.trace = [TraceEvent(now, "arrived")]
        self.blocks = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.text = ""
        self.key = f"{seed}:{prompt}:"  # the token draw's key prefix, built once


class FakeEngine:
    """Honours LLMEngine's contract: add_request/abort/step/has_unfinished/stats/tokenizer."""

    def __init__(
        self,
        step_time: float = 0.002,
        markers: bool = True,
        counts_compiles: bool = True,
        reports_kv: bool = True,
        script: str | None = None,
        chat_template: str | None = None,
        folder: str | None = None,
        **config,
    ) -> None:
        defaults = dict(
            max_model_len=128,
            max_num_seqs=4,
            max_num_batched_tokens=256,
            block_size=4,
            num_kv_blocks=256,
            dtype="float32",
            kv_cache_dtype="float32",
        )
        self.config = EngineConfig(**{**defaults, **config})
        self.tokenizer = FakeTokenizer()
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template
        self.script = script
        """Every request's output text, when set: SCRIPT_CHARS characters a token, then EOS."""
        self.model_name = "fake-model"
        self.folder = folder
        """A model folder whose config.json and processor the front end reads (images)."""
        self.images: dict[str, list] = {}
        """The images each request brought (request id -> list of ImageInput)."""
        self.device = torch.device("cpu")
        self.step_time = step_time
        self.markers = markers
        """Whether the prompt markers (module docstring) steer requests."""
        self.crash_next_step = False
        self.compiles_after_warmup: int | None = 0 if counts_compiles else None
        """What stats() reports as Triton compiles after warm-up (None: cannot count)."""
        if not reports_kv:  # an engine that does not say which request holds which blocks
            self.kv_blocks_by_request = None
        self._rng = random.Random(0)
        self._reqs: dict[str, _Req] = {}
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._aborted: list[_Req] = []
        self._blocks_used = 0
        self._totals = {"prompt": 0, "gen": 0, "steps": 0, "queries": 0, "hits": 0}
        self._cached: OrderedDict[int, None] = OrderedDict()
        """Keys of the cached full blocks, least recently used first."""
        self.bandwidth = BandwidthMeter(2**20, 1024, 50.0, "nominal (fake)")
        self.spec = SpecCounters() if self.config.speculative != "off" else None
        """With speculation: each running request drafts 2 tokens a step and 1 is accepted."""
        """Fed with every step as a decode of each running request (1 MiB of weights)."""

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> list[int]:
        return apply_chat_template(self.tokenizer, messages, tools, template_kwargs)

    def add_request(self, request_id, prompt, params, arrival_time=None, images=None) -> None:
        if request_id in self._reqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        for image in images or []:
            if image.end > len(prompt):
                raise ValueError(f"an image's placeholders end past the prompt: {image}")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty: send at least one token")
        if any(not 0 <= t < VOCAB for t in ids):
            raise ValueError(f"prompt token ids must be integers in [0, {VOCAB})")
        limit = self.config.max_model_len
        if len(ids) + params.max_tokens > limit:
            raise ValueError(f"maximum context length is {limit} tokens")
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        req = _Req(request_id, ids, params, seed, arrival_time or time.time())
        self._reqs[request_id] = req
        if images:
            self.images[request_id] = list(images)
        self._waiting.append(req)

    def abort(self, request_id: str) -> None:
        req = self._reqs.get(request_id)
        if req is None or req.finish_reason is not None:
            return
        self._finish(req, "abort")
        self._aborted.append(req)

    def kv_blocks_by_request(self) -> dict[str, int]:
        return {r.rid: r.blocks for r in self._running}

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._aborted)

    def stats(self) -> dict:
        return {
            "num_running": len(self._running),
            "num_waiting": len(self._waiting),
            "kv_blocks_used": self._blocks_used,
            "kv_blocks_total": self.config.num_kv_blocks,
            "num_preemptions_total": 0,
            "prompt_tokens_total": self._totals["prompt"],
            "generation_tokens_total": self._totals["gen"],
            "num_steps": self._totals["steps"],
            "compiles_after_warmup": self.compiles_after_warmup,
            "prefix_caching": self.config.prefix_caching,
            "prefix_cache_queries_total": self._totals["queries"],
            "prefix_cache_hits_total": self._totals["hits"],
            "kv_blocks_cached": len(self._cached),
            "bandwidth": self.bandwidth.report(),
            "spec_decode": {**self.spec.report(), "k": 2} if self.spec is not None else None,
        }

    def step(self) -> list[RequestOutput]:
        if self.crash_next_step:
            raise RuntimeError("simulated engine crash")
        touched, self._aborted = list(self._aborted), []
        self._admit()
        if self.crash_next_step:
            raise RuntimeError("simulated engine crash")
        if self._running:
            step = object()
            contexts = [len(r.prompt) + len(r.out) for r in self._running]
            self.bandwidth.launched(step, self.bandwidth.clock(), contexts)
            time.sleep(self.step_time)
            self.bandwidth.completed(step)
            self._totals["steps"] += 1
            if self.spec is not None:
                self.spec.num_drafts += len(self._running)
                self.spec.num_draft_tokens += 2 * len(self._running)
                self.spec.num_accepted_tokens += len(self._running)
        for req in list(self._running):
            if self.markers and STALL_MARK in req.prompt and req.out:
                continue
            self._advance(req)
            touched.append(req)
        return [self._output(r) for r in touched]

    # --- internals ----------------------------------------------------------------------
    def _admit(self) -> None:
        bs = self.config.block_size
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            req = self._waiting[0]
            need = -(-(len(req.prompt) + req.params.max_tokens) // bs)
            if self._blocks_used + need > self.config.num_kv_blocks:
                break
            self._waiting.popleft()
            if self.markers and CRASH_MARK in req.prompt:
                self.crash_next_step = True
            if (
                self.markers
                and COMPILE_MARK in req.prompt
                and self.compiles_after_warmup is not None
            ):
                self.compiles_after_warmup += 1
            req.blocks = need
            self._blocks_used += need
            self._running.append(req)
            now = time.time()
            req.metrics.first_scheduled_time = now
            req.trace.append(TraceEvent(now, "scheduled"))
            cached = self._look_up(req) if self.config.prefix_caching else 0
            req.metrics.num_cached_tokens = cached
            if cached:
                req.trace.append(TraceEvent(now, "prefix_cache_hit", {"tokens": cached}))
            computed = len(req.prompt) - cached
            req.trace.append(
                TraceEvent(now, "prefill_chunk", {"tokens": computed, "start": cached})
            )
            req.metrics.num_prefill_chunks = 1
            self._totals["prompt"] += len(req.prompt)

    def _block_keys(self, ids: list[int]) -> list[int]:
        """The chained key of each full block of `ids` (a block's key covers all before it)."""
        bs, keys, key = self.config.block_size, [], 0
        for end in range(bs, len(ids) + 1, bs):
            key = hash((key, *ids[end - bs : end]))
            keys.append(key)
        return keys

    def _look_up(self, req: _Req) -> int:
        """The longest cached prefix of the prompt in full blocks, short of its last token."""
        keys = self._block_keys(req.prompt)
        hits = 0
        for key in keys[: (len(req.prompt) - 1) // self.config.block_size]:
            if key not in self._cached:
                break
            hits += 1
        cached = hits * self.config.block_size
        self._totals["queries"] += len(req.prompt)
        self._totals["hits"] += cached
        self._remember(keys)
        return cached

    def _remember(self, keys: list[int]) -> None:
        for key in keys:
            self._cached[key] = None
            self._cached.move_to_end(key)
        while len(self._cached) > self.config.num_kv_blocks:
            self._cached.popitem(last=False)

    def _advance(self, req: _Req) -> None:
        p = req.params
        pos = len(req.out)
        key = f"{req.key}{pos}".encode()
        token = 16 + zlib.crc32(key) % (VOCAB - 16)
        if self.markers and EOS_MARK in req.prompt and pos == 3 and not p.ignore_eos:
            token = EOS_ID
        req.out.append(token)
        self._totals["gen"] += 1
        if req.logprobs is not None:
            top = [(token, -0.5)] + [((token + k) % VOCAB, -1.0 - k) for k in range(1, p.logprobs)]
            req.logprobs.append(Logprob(token, -0.5, top[: p.logprobs]))
        now = time.time()
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
            req.trace.append(TraceEvent(now, "first_token"))
        # incremental, as the real engine's detokenizer: decoding all tokens every step made
        # this stand-in's cost grow with the output length and dominate an HTTP load test
        if self.script is not None:
            req.text = self.script[: SCRIPT_CHARS * len(req.out)]
            if len(req.text) == len(self.script):
                return self._finish(req, "stop")
        else:
            req.text += self.tokenizer.decode([token], p.skip_special_tokens)
        for s in p.stop:
            if s in req.text:
                req.text = req.text[: req.text.index(s)]
                req.stop_reason = s
                return self._finish(req, "stop")
        if token == EOS_ID:
            return self._finish(req, "stop")
        if token in p.stop_token_ids:
            req.stop_reason = token
            return self._finish(req, "stop")
        if len(req.out) >= p.max_tokens:
            self._finish(req, "length")

    def _finish(self, req: _Req, reason: str) -> None:
        req.finish_reason = reason
        now = time.time()
        req.metrics.finished_time = now
        req.trace.append(TraceEvent(now, "finished", {"reason": reason}))
        if self.config.prefix_caching and req.metrics.first_scheduled_time is not None:
            self._remember(self._block_keys(req.prompt + req.out))  # the answer stays cached
        if req in self._running:
            self._running.remove(req)
            self._blocks_used -= req.blocks
        elif req in self._waiting:
            self._waiting.remove(req)

    def _output(self, req: _Req) -> RequestOutput:
        finished = req.finish_reason is not None
        if finished:
            self._reqs.pop(req.rid, None)
        return RequestOutput(
            request_id=req.rid,
            prompt_token_ids=req.prompt,  # shared, not copied: as LLMEngine does
            token_ids=list(req.out),
            text=req.text,
            finished=finished,
            finish_reason=req.finish_reason,
            metrics=req.metrics,
            logprobs=list(req.logprobs) if req.logprobs is not None else None,
            stop_reason=req.stop_reason,
            trace=list(req.trace) if finished else [],
        )
