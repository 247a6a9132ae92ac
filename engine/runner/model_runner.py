"""ModelRunner: every device concern. Owns the model, the KV-cache tensor, input preparation,
attention metadata, sampling-tensor preparation, CUDA graphs and the memory check after
warm-up (shrinking the pool before serving when the plan was short); runs one scheduled batch
per call.

KV cache: engine/memory/kv_pool.py's KVPool (one tensor per group of layers with the same KV heads
and head dim; each attention layer gets its K and V views, see engine/kernels/torch_ref.py for the
layout). A model with linear-attention layers also gets engine/memory/state_pool.py's StatePool
beside it: max_num_seqs slots of per-sequence state, allocated and released with the KV pool.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.memory.kv_pool import KVPool
from engine.memory.memory_cap import apply_memory_cap
from engine.memory.memory_check import (
    GIB,
    Measurement,
    MemoryItems,
    MemoryReport,
    blocks_to_shed,
    measure_cuda,
)
from engine.memory.state_pool import StatePool
from engine.models.loader import load_model
from engine.models.model_config import ModelConfig
from engine.quant.checkpoints import resolve_weight_quant
from engine.runner.attention_backends import select_backend
from engine.runner.cuda_graphs import DecodeGraphs, graph_batch_sizes
from engine.runner.forward_context import AttentionMetadata, forward_context
from engine.runner.input_prep import PendingFill, prepare_inputs, prepare_sampling
from engine.runner.pending_step import PendingStep
from engine.runner.pooler import Pooler
from engine.runner.sampler import SamplingTensors, sample
from engine.runner.vision_step import VisionStep, both_ways
from engine.scheduling.scheduler import ScheduledBatch
from engine.spec.draft_model import DraftModel
from engine.startup.kernel_choices import KernelChoices, choose_kernels
from engine.startup.phases import StartupTimer
from engine.structured.bitmask import apply_bitmask

logger = logging.getLogger("engine.memory")


class ModelRunner:
    def __init__(
        self,
        folder,
        model_config: ModelConfig,
        config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        timer: StartupTimer | None = None,
        draft: tuple[Path, ModelConfig] | None = None,
    ) -> None:
        """Builds the model and loads its weights. `timer`: where the start-up phases this
        runner runs (kernel choice, graph capture, warm-up, memory check) add their time.
        `draft`: a draft model's folder and config (speculative="draft:PATH"), loaded beside
        the model, its KV pool allocated and released with the model's."""
        self.timer = timer or StartupTimer()
        self.model_config = model_config
        self.config = config
        self.device = device
        self.dtype = dtype
        self.model = load_model(
            folder,
            model_config,
            config.max_model_len,
            dtype,
            device,
            random_weights=config.load_format == "random",
            quant=resolve_weight_quant(config, model_config),
        )
        self.draft = None if draft is None else DraftModel(*draft, config, device, dtype)
        vision = getattr(self.model, "vision", None)
        self.vision_step = (
            None if vision is None else VisionStep(vision, device, both_ways(self.model))
        )
        """Images: the encoder's rows and cache (None for a text-only model)."""
        self.multimodal_positions = vision is not None and hasattr(self.model, "rope_positions")
        """Its requests with images take 3-D positions (Request.mrope: Qwen3.5)."""
        self.block_size = config.block_size
        self.kv_pool = KVPool.empty()
        self.state_pool = StatePool.empty()
        self.graphs: DecodeGraphs | None = None
        self.pooler = Pooler()
        """Pools pooling requests' hidden states; the engine sets the one of its model's kind."""
        self.kernel_choices = (
            KernelChoices()
        )  # this engine's alone (engine/startup/kernel_choices.py)
        self.max_blocks_per_seq = -(-config.max_model_len // config.block_size)

    def allocate_kv_cache(self, num_blocks: int, kv_dtype: torch.dtype) -> None:
        """Allocate the paged pool and bind each attention layer's K/V views."""
        backend = select_backend(self.device)
        self.backend = backend
        if self.model_config.encoder is not None:  # bidirectional, whole prompts: no KV cache
            return
        layers = self.model.attention_layers()
        self.kv_pool = KVPool.allocate(
            self.model_config, layers, num_blocks, self.block_size, kv_dtype, self.device
        )
        for attn in layers:
            attn.backend = backend
        self.backend = backend
        if self.draft is not None:
            self.draft.allocate(num_blocks, kv_dtype)
        if self.model_config.linear_layer_ids():
            self.state_pool = StatePool.allocate(
                self.model_config,
                self.model.linear_layers(),
                self.config.max_num_seqs,
                self.dtype,
                self.device,
            )

    @property
    def kv_pool_bytes(self) -> int:
        """The KV pool, a draft model's K/V included (they share the blocks)."""
        return self.kv_pool.nbytes + (self.draft.nbytes if self.draft is not None else 0)

    def models(self) -> list[torch.nn.Module]:
        """The model, and the draft model beside it."""
        return [self.model] + ([self.draft.model] if self.draft is not None else [])

    @property
    def state_pool_bytes(self) -> int:
        return self.state_pool.nbytes

    def release_kv_cache(self) -> None:
        """Drop every reference to the pool, so a smaller one never sits beside it."""
        KVPool.unbind(self.model.attention_layers())
        self.kv_pool = KVPool.empty()
        if self.draft is not None:
            self.draft.release()
        if self.model_config.linear_layer_ids():
            StatePool.unbind(self.model.linear_layers())
        self.state_pool = StatePool.empty()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def uses_cuda_graphs(self) -> bool:
        return (
            self.device.type == "cuda"
            and not self.config.enforce_eager
            and self.backend.name == "triton"
            and self.model_config.encoder is None  # an encoder has no decode step to capture
        )

    def choose_kernels(self) -> None:
        """Time the decode kernels' candidates on the device, before graphs capture them
        (enforce_eager: the batch-1 GEMV configs only)."""
        if self.device.type != "cuda" or self.backend.name != "triton":
            return
        cfg = self.config
        with self.timer.phase("kernel_choice"):
            choose_kernels(
                self.model, self.kernel_choices, self.dtype, cfg.max_num_seqs, cfg.enforce_eager
            )

    def capture_cuda_graphs(self) -> None:
        """Capture decode graphs for the batch-size ladder (CUDA, unless enforce_eager)."""
        if not self.uses_cuda_graphs():
            return
        self.choose_kernels()  # chosen once: later calls find every choice made
        with self.timer.phase("graph_capture"):
            self._capture_cuda_graphs()

    def _capture_cuda_graphs(self) -> None:
        from engine.kernels.decode_attention import default_num_splits

        cfg, max_len = self.model_config, self.config.max_model_len
        sizes = graph_batch_sizes(self.config.max_num_seqs)
        splits = {
            bs: default_num_splits(bs, cfg.num_kv_heads, max_len, self.device) for bs in sizes
        }
        self.graphs = DecodeGraphs(
            self.model,
            self.config.max_num_seqs,
            self.max_blocks_per_seq,
            max_len,
            cfg.hidden_size,
            self.dtype,
            self.device,
            splits,
            has_state=bool(cfg.linear_layer_ids()),
        )
        self.graphs.capture()

    def check_memory(
        self,
        predicted: MemoryItems,
        workload: Callable[[], None],
        measure: Callable[..., Measurement] | None = None,
    ) -> MemoryReport | None:
        """On CUDA (or with `measure`): capture graphs, run the warm-up workload, measure, and
        when the peak exceeds the prediction shrink the pool (re-allocated, graphs captured
        again: they hold the pool's address) before serving. None on the CPU. Raises
        ValueError, naming the setting to change, when even a shrunk pool cannot hold one
        max_model_len sequence."""
        if self.device.type == "cuda":
            apply_memory_cap(self.device)
        measure = measure or (measure_cuda if self.device.type == "cuda" else None)
        if measure is None or self.model_config.encoder is not None:  # an encoder: no KV pool
            return None
        with self.timer.phase("memory_check"):
            return self._check_memory(predicted, workload, measure)

    def _check_memory(
        self,
        predicted: MemoryItems,
        workload: Callable[[], None],
        measure: Callable[..., Measurement],
    ) -> MemoryReport:
        def timed_workload() -> None:
            with self.timer.phase("warm_up"):
                workload()

        got = measure(self, timed_workload)
        cfg, num_blocks = self.config, self.kv_pool.num_blocks
        block_bytes = max(1, got.items.kv_pool // num_blocks)
        shed = blocks_to_shed(got.peak, predicted.total, block_bytes)
        report = MemoryReport(
            predicted, got.items, got.peak, predicted.total, num_blocks, shed, block_bytes
        )
        for line in report.lines():
            logger.info(line)
        if shed:
            keep = num_blocks - shed
            if keep * cfg.block_size < cfg.max_model_len:
                tokens = max(0, keep) * cfg.block_size
                fits = tokens // 256 * 256 or tokens  # a round figure where one fits
                change = (
                    f"set max_model_len to {fits}"
                    if fits
                    else "free the device memory other processes hold, or lower "
                    "gpu_memory_utilization"
                )
                raise ValueError(
                    f"after warm-up the engine needs {report.excess / GIB:.2f} GiB more than "
                    f"planned and the KV pool cannot shrink below one max_model_len="
                    f"{cfg.max_model_len} sequence: {change}"
                )
            self.graphs = None  # they point at the old pool
            kv_dtype = self.kv_pool.dtype
            self.release_kv_cache()
            self.allocate_kv_cache(keep, kv_dtype)
            self.capture_cuda_graphs()
        return report

    # --- execution ---------------------------------------------------------------------------
    def forward(self, batch: ScheduledBatch, prev: PendingStep | None = None) -> Forward:
        """Queue the batch's forward and logits. Decodes whose input token is still pending
        read it from `prev` (the step launched just before) on the device."""
        return self.launch(self.prepare(batch, prev.rows if prev is not None else None), prev)

    @torch.inference_mode()
    def prepare(self, batch: ScheduledBatch, pending_rows: dict[int, int] | None) -> Prepared:
        """The host half of `forward`: the batch's inputs, uploaded. pending_rows: id(request)
        -> its row in the step whose tokens the decodes will read (launched before `launch`)."""
        inputs = prepare_inputs(
            batch, self.block_size, self.device, pending_rows, self.multimodal_positions
        )
        return Prepared(batch, *inputs)

    @torch.inference_mode()
    def launch(self, prep: Prepared, prev: PendingStep | None) -> Forward:
        """The device half of `forward`: queue the prepared batch's forward and logits."""
        batch, input_ids, positions, meta = prep.batch, prep.input_ids, prep.positions, prep.meta
        if prep.fill is not None:
            prep.fill.apply(input_ids, prev.out.token_ids)
        if self.graphs is not None and batch.num_decodes == len(batch.requests) <= (
            self.graphs.max_batch
        ):
            hidden = self.graphs.run(input_ids, positions, meta)
        else:
            images = None
            if self.vision_step is not None:
                images, meta.image_spans = self.vision_step.prepare(batch, meta.query_start_loc_cpu)
            extra = () if images is None else (images,)
            with forward_context(meta):
                hidden = self.model(input_ids, positions, *extra)  # [num_tokens, hidden]
        pooled = self._pool(batch, hidden, prep.meta.query_start_loc_cpu)
        rows = batch.sampling_indices
        if not rows:
            return Forward(batch, rows, None, None, prev, pooled)
        # [num_sampling + drafted tokens, vocab]: one row per sampling request, plus one per
        # drafted token of a speculative step (engine/spec/step.py)
        logits = self.model.compute_logits(hidden[prep.logits_rows])
        # Read the requests' sampling state now, before the step advances them (each row's
        # token index seeds its random draw).
        reqs = [batch.requests[i] for i in rows]
        tensors = prepare_sampling(reqs, self.model_config.vocab_size, self.device)
        return Forward(batch, rows, logits, tensors, prev, pooled)

    def rope_positions(self, token_ids: list[int], images: list) -> tuple | None:
        """A prompt's multimodal RoPE positions and delta (Request.mrope), for a model that
        has them (Qwen3.5 with images); None for the others."""
        return self.model.rope_positions(token_ids, images) if self.multimodal_positions else None

    def release(self, req) -> None:
        """A request left the engine: drop its hold on cached encoder rows."""
        if self.vision_step is not None and req.images:
            self.vision_step.release(req)

    def _pool(
        self, batch: ScheduledBatch, hidden: torch.Tensor, query_start_loc: list[int]
    ) -> dict[int, list[float]]:
        """Batch index -> vector of each pooling request whose prefill ends this step (read
        back now: a step with pooling requests does not overlap the next)."""
        indices = batch.pooling_indices
        if not indices:
            return {}
        spans = [(query_start_loc[i], query_start_loc[i + 1]) for i in indices]
        tasks = [batch.requests[i].params.pooling for i in indices]
        return dict(zip(indices, self.pooler.pool(self.model, hidden, spans, tasks)))

    @torch.inference_mode()
    def sample(self, fwd: Forward, bitmask: torch.Tensor | None = None) -> PendingStep:
        """Queue the sampling of a forward's logits; `bitmask` (host int32 [num_sampling,
        words], engine.structured) masks the tokens a grammar does not allow."""
        if fwd.logits is None:
            return PendingStep.launched(fwd.batch, fwd.sampling_rows, None)
        logits = fwd.logits if bitmask is None else apply_bitmask(fwd.logits, bitmask)
        out = sample(logits, fwd.sampling)
        return PendingStep.launched(fwd.batch, fwd.sampling_rows, out)


@dataclass
class Prepared:
    """A scheduled batch's inputs on the device, its forward not yet queued."""

    batch: ScheduledBatch
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    fill: PendingFill | None
    """Where the decodes' pending input tokens go (from the step launched before)."""


@dataclass
class Forward:
    """A batch whose forward is queued and whose tokens are not sampled yet."""

    batch: ScheduledBatch
    sampling_rows: list[int]
    """Batch index of each sampling request (of each row of logits, without drafts)."""
    logits: torch.Tensor | None
    sampling: SamplingTensors | None
    prev: PendingStep | None
    """The step before, kept alive: this forward reads its tokens on the device."""
    pooled: dict[int, list[float]] = field(default_factory=dict)
    """Batch index -> vector of each pooling request that finished its prefill."""

    @property
    def sampling_requests(self) -> list:
        return [self.batch.requests[i] for i in self.sampling_rows]
