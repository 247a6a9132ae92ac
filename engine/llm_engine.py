"""LLMEngine: loads a model and runs the step loop (schedule, run, update) over requests. What
it settles before the weights load (model, plan, tokenizer) is engine/startup/model_setup.py.

Not thread-safe: one thread owns it (the engine core process runs it in its loop, engine.core).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path

from engine.engine_stats import engine_stats
from engine.memory.bandwidth import BandwidthMeter
from engine.memory.memory_check import Measurement, MemoryItems
from engine.models.model_kind import model_kind
from engine.multimodal import ImageInput, check_images
from engine.planner import Device
from engine.runner import compile_count
from engine.runner.model_runner import Forward, ModelRunner, Prepared
from engine.runner.pending_step import PendingStep, request_rows
from engine.runner.pooler import pooler_for
from engine.runner.warmup import WarmUp, run_peak_step
from engine.sampling_params import SamplingParams
from engine.scheduling.request import Request, RequestOutput, RequestStatus, check_prompt
from engine.scheduling.setup import build_scheduling
from engine.spec.step import SpecCounters, spec_decoder
from engine.startup.model_setup import set_up_model
from engine.startup.phases import StartupTimer, startup_line
from engine.startup.planned_config import TORCH_DTYPES
from engine.structured.grammar_state import start_tokens
from engine.structured.llguidance_backend import llguidance_pool
from engine.structured.pool import GrammarPool
from engine.text.outputs import Outputs
from engine.text.tokenizer import apply_chat_template, encode_prompt

logger = logging.getLogger(__name__)

COMPILE_WAIT_S = 0.005
"""How long a step with nothing to run but grammar compiles waits for one (new requests then
wait at most this long to be taken)."""


class LLMEngine:
    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "auto",
        device_info: Device | None = None,
        measure: Callable[..., Measurement] | None = None,
        on_phase: Callable[[str], None] | None = None,
        plan_targets: dict | None = None,
        **config,
    ) -> None:
        """`config`: EngineConfig settings; every one left out (or "auto") is planned for this
        model on this device (engine.planner), as `appliance serve` plans it. device_info: the
        Device to plan for (default: read here). measure: replaces the CUDA memory measurement
        after warm-up (tests). on_phase: called with each start-up phase's name as it begins
        (engine.startup.phases.PHASE_WORDS; the engine core reports them to the front end).
        plan_targets: PlanRequest fields that are no engine setting (the server's image limits,
        engine.planner.IMAGE_LIMITS), for the plan."""
        timer = StartupTimer(on_phase)
        setup = set_up_model(model, device, device_info, config, timer, plan_targets)
        self.device, self.folder, self.model_name = setup.device, setup.folder, setup.model_name
        self.model_config, self.plan, self.config = setup.model_config, setup.plan, setup.config
        self.tokenizer, self.eos_token_ids = setup.tokenizer, setup.eos_token_ids
        self.dtype = TORCH_DTYPES[self.config.dtype]
        self.kv_dtype = TORCH_DTYPES[self.config.kv_cache_dtype]
        with timer.phase("load"):
            self.runner = ModelRunner(
                self.folder,
                self.model_config,
                self.config,
                self.device,
                self.dtype,
                timer,
                setup.draft,
            )
        self.is_encoder = self.model_config.encoder is not None
        self.kind = model_kind(self.folder, self.is_encoder, self.config.task)
        self.runner.pooler = pooler_for(self.kind, self.runner.model, self.tokenizer)
        self._rng = random.Random(self.config.seed)
        self._requests: dict[str, Request] = {}
        self._outputs_of = Outputs(
            self.tokenizer, lambda req: self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
        )
        """Each live request's detokenizer, and its RequestOutput each step."""
        self._aborted: list[Request] = []
        self._pooled: list[Request] = []
        """Pooling requests finished by a step's launch, reported at the end of that step."""
        self._pending: PendingStep | None = None
        self._next: tuple[Forward, list] | None = None
        """A forward queued behind a constrained step's sample, to sample next call."""
        self.grammars = None  # without a tokenizer (token-id benchmarks): no structured outputs
        if self.tokenizer is not None:
            self.grammars = llguidance_pool(
                self.tokenizer,
                self.model_config.vocab_size,
                self.eos_token_ids,
                self.config.max_num_seqs,
                self.device,
            )
        self.spec = spec_decoder(self.config, self.model_config, self.runner.draft)
        # Speculative steps run without the overlap (a step's drafts need the last one's tokens
        # on the host); the steps where nobody drafts keep it.
        self._overlap = self.config.overlap_steps and self.device.type == "cuda"
        self.bandwidth = BandwidthMeter.for_plan(self.plan)
        with timer.phase("kv_alloc"):
            self.runner.allocate_kv_cache(self.config.num_kv_blocks, self.kv_dtype)
            self._new_scheduler(self.config.num_kv_blocks)
            self._reset_counters()
        self.compiles = compile_count.CompileWatch()  # from the end of warm-up: see step()
        # On CUDA: capture graphs, warm up, measure; the runner shrinks its pool if the
        # measured peak exceeds the plan, and the scheduler follows.
        self.memory = self.runner.check_memory(
            MemoryItems.from_plan(self.plan), self._warm_up_to_peak, measure
        )
        if self.memory is not None and self.memory.shed_blocks:
            self.config.num_kv_blocks = self.memory.final_blocks
            self._new_scheduler(self.memory.final_blocks)
        if self.spec is not None and self.spec.measure(self, timer):
            self._reset_counters()  # after the adaptive k's step costs (engine/spec/measure.py)
        self.compiles.start_now()
        self.startup_s = timer.report()
        """Seconds per start-up phase, in order, then "total" (plain floats: it pickles)."""
        logger.info(startup_line(self.startup_s))

    def _new_scheduler(self, num_blocks: int) -> None:
        vision = self.runner.vision_step
        built = build_scheduling(
            self.config,
            self.model_config,
            num_blocks,
            self.is_encoder,
            None if vision is None else vision.both_ways,
        )
        self.block_manager, self.scheduler = built.block_manager, built.scheduler
        self.image_limits = built.image_limits
        """check_images' (image token id, most tokens of one image) for this model."""

    def _reset_counters(self) -> None:
        self.num_steps = self.prompt_tokens_total = self.generation_tokens_total = 0
        self.scheduler.num_preemptions = 0
        self.scheduler.prefix_queries = self.scheduler.prefix_hits = 0
        self.bandwidth.reset()
        if self.spec is not None:
            self.spec.counters = SpecCounters()

    def plan_report(self) -> dict:
        """The plan, the memory check after warm-up (None on the CPU) and the seconds each
        start-up phase took, for /v1/stats."""
        check = self.memory.to_dict() if self.memory is not None else None
        return {**self.plan.to_dict(), "memory_check": check, "startup_s": dict(self.startup_s)}

    def warm_up(self) -> None:
        """Run the steps serving will meet, so no kernel variant compiles while users wait
        (engine/runner/warmup.py): a full-budget prefill step (several prompts where max_model_len
        is shorter than the budget, so the activation peak the memory check measures is the
        serving one), a lone prefill of every token-count class, decodes beside prefill chunks
        (one and several, short and long contexts), a chunk continuing a prompt longer than the
        budget; greedy, seeded and fully featured sampling. Counters are reset afterwards."""
        if self.is_encoder:  # no KV cache, no sampling: nothing of this applies
            return
        WarmUp(self).run()
        self._reset_counters()

    def run_peak_step(self) -> None:
        """The heaviest steps serving can meet (engine/runner/warmup.py, run_peak_step)."""
        if self.is_encoder:
            return
        run_peak_step(self)
        self._run_to_completion()

    def _warm_up_to_peak(self) -> None:
        """The memory check's workload: every shape, then the heaviest step."""
        self.warm_up()
        self.run_peak_step()

    def _run_to_completion(self) -> None:
        while self.has_unfinished():
            self.step()
        self._reset_counters()

    # --- requests ----------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> list[int]:
        return apply_chat_template(self.tokenizer, messages, tools, template_kwargs)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        images: list[ImageInput] | None = None,
    ) -> None:
        """Queue a request; raises ValueError (saying what to change) for bad input. `images`:
        the prompt's images (engine.multimodal), their placeholders already in the prompt."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.validate(token_ids, params, images)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        req = Request(request_id, token_ids, params, seed, self.eos_token_ids, arrival_time, images)
        if images:
            req.mrope = self.runner.rope_positions(token_ids, req.images)
        self._requests[request_id] = req
        self._outputs_of.start(req)
        if params.structured is None:
            self.scheduler.add(req)
        else:
            req.record("grammar_compiling", kind=params.structured.kind)
            self.grammars.submit(req, *start_tokens(self.tokenizer, params.structured))

    def check_structured(self, params: SamplingParams) -> None:
        """Compile the request's grammar here and now: ValueError (GrammarError) saying what is
        wrong with it. The offline API and the front end check before queueing; the core's
        own compile then runs beside the step loop."""
        if params.structured is not None:
            self._grammar_pool_or_refuse().backend.compile(params.structured)

    def _grammar_pool_or_refuse(self) -> GrammarPool:
        if self.grammars is None:
            raise ValueError(
                "structured outputs need the model's tokenizer, and this model has none"
            )
        return self.grammars

    def validate(
        self, token_ids: list[int], params: SamplingParams, images: list[ImageInput] | None = None
    ) -> None:
        """ValueError, saying what to change, for a request this engine cannot take (its
        images included: engine.multimodal.check_images, for any request to a model that
        reads images)."""
        check_prompt(token_ids, params, self.model_config.vocab_size, self.config.max_model_len)
        if images or self.image_limits[0] is not None:
            check_images(token_ids, images or [], *self.image_limits)
        if self.is_encoder:
            if params.pooling is None:
                raise ValueError("this encoder model generates no text: send it pooling requests")
            if len(token_ids) > self.config.max_num_batched_tokens:
                raise ValueError(
                    f"an encoder runs each input whole in one step of at most "
                    f"max_num_batched_tokens={self.config.max_num_batched_tokens} tokens; the "
                    f"input has {len(token_ids)}: shorten it"
                )
        if params.pooling == "score" and not self.runner.pooler.can_score:
            raise ValueError("this model is not a reranker: it cannot score documents")
        if params.structured is not None:
            self._grammar_pool_or_refuse()

    def abort(self, request_id: str) -> None:
        """Finish a request now and free its KV blocks; reported by the next step()."""
        req = self._requests.get(request_id)
        if req is None or req.is_finished:
            return
        if self.grammars is not None and self.grammars.cancel(request_id) is not None:
            req.finish(RequestStatus.FINISHED_ABORTED)
        else:
            self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
        self._aborted.append(req)

    def has_unfinished(self) -> bool:
        return (
            self.scheduler.num_unfinished > 0
            or bool(self._aborted)
            or self._pending is not None
            or self._next is not None
            or bool(self._pooled)
            or bool(self.grammars)
        )

    # --- the step loop -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, launch, update. Returns an output for each request that advanced.

        With overlap (GPU), the step launched here is read back by the next call: tokens are
        reported one step late, and the device runs while the host does the bookkeeping."""
        touched, self._aborted = list(self._aborted), []
        if self.grammars:
            if not (touched or self.scheduler.num_unfinished or self._pending or self._next):
                self.grammars.wait(COMPILE_WAIT_S)  # only compiles to wait for: no busy loop
            touched += self.grammars.admit_ready(self.scheduler)
        if self.spec is not None and self._next is None:
            chosen = self.spec.choose(self.scheduler.running)
            if chosen and self._pending is not None:
                touched += self._resolve()  # drafts continue the tokens of the step in flight
            if chosen and self.spec.draft(chosen):
                return self._spec_step(touched)
        launched = None
        if self._next is not None:  # queued by the previous call (a constrained step)
            (fwd, constrained), self._next = self._next, None
        else:
            if self._pending is not None and self._penalties_pending():
                # Penalties count output tokens on the host: read the pending ones first,
                # before scheduling, so a request they finish is never scheduled again.
                touched += self._resolve()
            fwd, constrained = self._launch_forward()
        if fwd is not None and not constrained:
            launched, fwd = self.runner.sample(fwd), None
        if self._pending is not None:
            touched += self._resolve()
        outputs = []
        if fwd is not None:
            # The grammar needs every token so far: the previous step's are read back above,
            # while the device runs this step's forward; the masks are filled now, then sampled.
            overlap = self._overlap and not any(r.has_penalties for r in fwd.batch.requests)
            masks = self.grammars.begin_masks(constrained, len(fwd.sampling_rows), overlap)
            if overlap:
                # While the masks fill (on the mask thread, for a large batch): report the
                # tokens read back, schedule and prepare the next forward; then queue the sample
                # and that forward behind it, so the device computes it while the host reports
                # and fills the next masks.
                outputs, touched = self._outputs(touched), []
                prepared = self._prepare_forward(request_rows(fwd.batch, fwd.sampling_rows))
                launched = self._pending = self.runner.sample(fwd, masks())
                if prepared is not None:
                    self._next = self._launch_prepared(prepared)
            else:
                launched = self.runner.sample(fwd, masks())
        self._pending = launched
        if launched is not None and not self._overlap:
            touched += self._resolve()
        self.compiles.log_new(logger)
        touched += self._pooled
        self._pooled = []
        return outputs + self._outputs(touched)

    def _outputs(self, touched: list[Request]) -> list[RequestOutput]:
        return [self._output(req) for req in dict.fromkeys(touched)]

    def _spec_step(self, touched: list[Request]) -> list[RequestOutput]:
        """A step with drafted tokens (engine/spec/step.py), without overlap: forward, verify,
        apply the tokens."""
        fwd, constrained = self._launch_forward(drafting=True)
        if fwd is not None:
            emitted = self.spec.verify(fwd, constrained, self.grammars)
            self.bandwidth.completed(fwd.batch)
            self.generation_tokens_total += sum(map(len, emitted.values()))
            touched += self.spec.apply(self.scheduler, fwd.batch, emitted)
        self.spec.clear()
        self.compiles.log_new(logger)
        touched += self._pooled
        self._pooled = []
        return self._outputs(touched)

    def _launch_forward(self, drafting: bool = False) -> tuple[Forward | None, list]:
        """Schedule a batch, queue its forward (reading the pending step's tokens on the
        device) and advance it: (the forward, [(row, grammar) of its constrained rows]), or
        (None, []) when nothing is scheduled. drafting: a speculative step, whose draft model
        (if any) drafts once the batch is scheduled."""
        pending_rows = self._pending.rows if self._pending is not None else None
        prepared = self._prepare_forward(pending_rows, drafting)
        return (None, []) if prepared is None else self._launch_prepared(prepared)

    def _prepare_forward(
        self, pending_rows: dict[int, int] | None, drafting: bool = False
    ) -> Prepared | None:
        """Schedule a batch and prepare its inputs (None: nothing scheduled). pending_rows: the
        rows of the step whose tokens its decodes read (pending_step.request_rows)."""
        start = self.bandwidth.clock()
        batch = self.scheduler.schedule()
        if batch.is_empty:
            return None
        if drafting:
            self.spec.draft_scheduled(batch)
        contexts = None  # a step with prompt tokens: left out of the bandwidth figure
        if batch.num_decodes == len(batch.requests):
            contexts = [r.num_computed_tokens + 1 for r in batch.requests]
        self.bandwidth.launched(batch, start, contexts)
        self.prompt_tokens_total += sum(
            max(0, min(r.num_computed_tokens + n, r.num_prompt_tokens) - r.num_computed_tokens)
            for r, n in zip(batch.requests, batch.num_new_tokens)
        )
        return self.runner.prepare(batch, pending_rows)

    def _launch_prepared(self, prepared: Prepared) -> tuple[Forward, list]:
        """Queue a prepared batch's forward behind the pending step and advance the batch."""
        fwd = self.runner.launch(prepared, self._pending)
        constrained = [
            (row, r.grammar) for row, r in enumerate(fwd.sampling_requests) if r.grammar is not None
        ]
        self.scheduler.advance(prepared.batch)
        self.num_steps += 1
        for i, vector in fwd.pooled.items():  # prefill done: the vector is the whole answer
            req = prepared.batch.requests[i]
            if not req.is_finished:
                req.pooled = vector
                self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
                self._pooled.append(req)
        return fwd, constrained

    def compiles_after_warmup(self) -> list[str]:
        """Each kernel variant built since the warm-up ended: "kernel: specialisation"."""
        return self.compiles.since_start()

    def _resolve(self) -> list[Request]:
        """Read the pending step's tokens back and apply them."""
        pending, self._pending = self._pending, None
        sampled = pending.collect()
        self.bandwidth.completed(pending.batch)
        self.generation_tokens_total += len(sampled)
        return self.scheduler.resolve(pending.batch, sampled)

    def _penalties_pending(self) -> bool:
        """A request with penalties has a token still on the device (the pending step's)."""
        return any(r.num_pending and r.has_penalties for r in self._pending.batch.requests)

    def _output(self, req: Request) -> RequestOutput:
        out = self._outputs_of.output(req)
        if out.finished:
            del self._requests[req.request_id]
            if self.spec is not None:
                self.spec.release(req.request_id)
            self.runner.release(req)
        return out

    def stats(self) -> dict:
        """Counters and gauges for /v1/stats, /metrics and the dashboard (engine_stats.py)."""
        return engine_stats(self)
