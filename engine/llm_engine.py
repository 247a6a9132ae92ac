"""LLMEngine: loads a model and runs the step loop (schedule, run, update) over requests.

Not thread-safe: one thread owns it (AsyncEngine runs it in its own thread).
"""

from __future__ import annotations

import random
from pathlib import Path

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.memory_check import MemoryItems, settle_kv_pool
from engine.model_runner import ModelRunner
from engine.models.config import ModelConfig
from engine.models.loader import resolve_model_folder
from engine.pending_step import PendingStep
from engine.planning import (
    plan_num_kv_blocks,
    resolve_device,
    resolve_dtypes,
    resolve_max_model_len,
)
from engine.request import Request, RequestOutput, RequestStatus
from engine.sampling_params import SamplingParams
from engine.tokenizer import apply_chat_template, eos_token_ids, load_tokenizer


class LLMEngine:
    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "auto",
        predicted_memory: MemoryItems | None = None,
        **config,
    ) -> None:
        """predicted_memory: the planner's prediction, checked against the measured peak after
        warm-up (engine.memory_check); None = check against memory x gpu_memory_utilization."""
        self.config = EngineConfig.from_kwargs(**config)
        self.device = resolve_device(device)
        self.folder = resolve_model_folder(model)
        self.model_name = Path(model).stem if model is not None else "SmolLM2-135M-Instruct"
        self.model_config = ModelConfig.from_folder(self.folder)
        self.tokenizer = None  # random-weight benchmarks may come without one: token ids only
        if self.config.load_format != "random" or (self.folder / "tokenizer_config.json").exists():
            self.tokenizer = load_tokenizer(self.folder)
        self.eos_token_ids = (
            eos_token_ids(self.folder, self.tokenizer)
            if self.tokenizer is not None
            else frozenset()
        )
        self.dtype, self.kv_dtype = resolve_dtypes(self.config, self.model_config, self.device)
        self.config.dtype = str(self.dtype).removeprefix("torch.")
        self.config.kv_cache_dtype = str(self.kv_dtype).removeprefix("torch.")
        self.config.max_model_len = resolve_max_model_len(
            self.config, self.model_config, self.device
        )
        self.runner = ModelRunner(
            self.folder, self.model_config, self.config, self.device, self.dtype
        )
        if self.config.num_kv_blocks is None:
            self.config.num_kv_blocks = plan_num_kv_blocks(
                self.config, self.model_config, self.device, self.kv_dtype
            )
        self._check_pool_fits()
        self._rng = random.Random(self.config.seed)
        self._requests: dict[str, Request] = {}
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._aborted: list[Request] = []
        self.num_steps = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._pending: PendingStep | None = None
        self._overlap = self.config.overlap_steps and self.device.type == "cuda"
        # Allocates the KV pool and builds block manager + scheduler; on CUDA also captures
        # graphs, warms up and shrinks the pool if the measured peak exceeds the prediction.
        self.memory = settle_kv_pool(self, predicted_memory)

    def _check_pool_fits(self) -> None:
        cfg = self.config
        capacity = cfg.num_kv_blocks * cfg.block_size
        if capacity < cfg.max_model_len:
            raise ValueError(
                f"the KV cache holds {capacity} tokens ({cfg.num_kv_blocks} blocks of "
                f"{cfg.block_size}), less than max_model_len={cfg.max_model_len}: set "
                f"max_model_len <= {capacity} or num_kv_blocks >= "
                f"{-(-cfg.max_model_len // cfg.block_size)}"
            )

    def warm_up(self) -> None:
        """Run the step shapes serving will meet, so no kernel compiles while users wait: a
        full-budget prefill step (several prompts where max_model_len is shorter than the
        budget, so the activation peak the memory check measures is the serving one), a decode
        batch beside prefill chunks of odd and aligned lengths, and plain decodes. Counters are
        reset afterwards."""
        cfg = self.config
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        lengths = [cfg.budget_prompt_lengths(params.max_tokens), [1], [17], [32], [100], [333]]
        gen = random.Random(0)
        vocab = self.model_config.vocab_size
        for i, group in enumerate(lengths):
            for j, n in enumerate(x for x in group if 0 < x <= cfg.max_model_len - 4):
                prompt = [gen.randrange(vocab) for _ in range(n)]
                self.add_request(f"__warmup-{i}-{j}", prompt, params)
            self.step()  # staggered arrivals: decodes run beside new prefill chunks
        while self.has_unfinished():
            self.step()
        self.num_steps = self.prompt_tokens_total = self.generation_tokens_total = 0
        self.scheduler.num_preemptions = 0

    # --- requests ----------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass prompts as token ids")
        return self.tokenizer.encode(prompt)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return apply_chat_template(self.tokenizer, messages)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; raises ValueError (saying what to change) for bad input."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.validate(token_ids, params)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        req = Request(request_id, token_ids, params, seed, self.eos_token_ids, arrival_time)
        self._requests[request_id] = req
        if self.tokenizer is not None:
            self._detokenizers[request_id] = IncrementalDetokenizer(
                self.tokenizer, token_ids, params.skip_special_tokens, params.stop
            )
        self.scheduler.add(req)

    def validate(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty: send at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
        limit = self.config.max_model_len
        total = len(token_ids) + params.max_tokens
        if total > limit:
            raise ValueError(
                f"This model's maximum context length is {limit} tokens; the request asks for "
                f"{total} ({len(token_ids)} in the prompt, {params.max_tokens} to generate). "
                "Shorten the prompt or lower max_tokens."
            )

    def abort(self, request_id: str) -> None:
        """Finish a request now and free its KV blocks; reported by the next step()."""
        req = self._requests.get(request_id)
        if req is None or req.is_finished:
            return
        self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
        self._aborted.append(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0 or bool(self._aborted) or self._pending is not None

    # --- the step loop -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, launch, update. Returns an output for each request that advanced.

        With overlap (GPU), the step launched here is read back by the next call: tokens are
        reported one step late, and the device runs while the host does the bookkeeping."""
        touched, self._aborted = list(self._aborted), []
        batch = self.scheduler.schedule()
        launched = None
        if not batch.is_empty:
            self.prompt_tokens_total += sum(
                max(0, min(r.num_computed_tokens + n, r.num_prompt_tokens) - r.num_computed_tokens)
                for r, n in zip(batch.requests, batch.num_new_tokens)
            )
            if self._pending is not None and self._needs_tokens_on_host(batch):
                touched += self._resolve()
            launched = self.runner.launch(batch, self._pending)
            self.scheduler.advance(batch)
            self.num_steps += 1
        if self._pending is not None:
            touched += self._resolve()
        self._pending = launched
        if launched is not None and not self._overlap:
            touched += self._resolve()
        return [self._output(req) for req in dict.fromkeys(touched)]

    def _resolve(self) -> list[Request]:
        """Read the pending step's tokens back and apply them."""
        pending, self._pending = self._pending, None
        sampled = pending.collect()
        self.generation_tokens_total += len(sampled)
        return self.scheduler.resolve(pending.batch, sampled)

    @staticmethod
    def _needs_tokens_on_host(batch) -> bool:
        """Penalties count output tokens on the host: they need pending tokens read first."""
        return any(r.num_pending and r.has_penalties for r in batch.requests)

    def _output(self, req: Request) -> RequestOutput:
        detok = self._detokenizers.get(req.request_id)
        if detok is not None and req.status is not RequestStatus.FINISHED_ABORTED:
            self._detokenize(req, detok)
        finished = req.is_finished
        if finished:
            del self._requests[req.request_id]
            self._detokenizers.pop(req.request_id, None)
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            token_ids=req.output_token_ids,
            text=detok.text if detok is not None else "",
            finished=finished,
            finish_reason=req.status.value if finished else None,
            metrics=req.metrics.snapshot(),  # readers on other threads
            logprobs=list(req.logprobs) if req.logprobs is not None else None,
            stop_reason=req.stop_reason,
            trace=list(req.trace) if finished else [],
        )

    def _detokenize(self, req: Request, detok: IncrementalDetokenizer) -> None:
        """Feed the new token to the detokenizer; a matched stop string finishes the request."""
        if detok.stopped_on is not None:
            return
        detok.step(req.token_ids[-1 - req.num_pending : len(req.token_ids) - req.num_pending])
        if detok.stopped_on is not None:
            req.stop_reason = detok.stopped_on
            self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
        elif req.is_finished:
            detok.finish()

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def stats(self) -> dict:
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_blocks_used": self.block_manager.num_used_blocks,
            "kv_blocks_total": self.block_manager.num_blocks,
            "num_preemptions_total": self.scheduler.num_preemptions,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "num_steps": self.num_steps,
        }
