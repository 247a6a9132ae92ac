"""ModelRunner: every device concern. Owns the model, the KV-cache tensor, input preparation,
attention metadata and sampling-tensor preparation; runs one scheduled batch per call.

KV cache: one tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]; each
attention layer gets its K and V views (see engine/kernels/torch_ref.py for the layout). An
int8 cache has a second tensor beside it, fp16 scales [num_layers, 2, num_blocks, block_size,
num_kv_heads].
"""

from __future__ import annotations

import torch

from engine.attention import select_backend
from engine.config import EngineConfig
from engine.context import forward_context
from engine.cuda_graphs import DecodeGraphs, graph_batch_sizes
from engine.input_prep import prepare_inputs, prepare_sampling
from engine.kernels.torch_ref import KV_SCALE_DTYPE
from engine.models.config import ModelConfig
from engine.models.loader import load_model
from engine.pending_step import PendingStep
from engine.planning import resolve_weight_quant
from engine.request import Logprob
from engine.sampler import sample
from engine.scheduler import ScheduledBatch
from engine.tuning import KernelChoices, choose_kernels


class ModelRunner:
    def __init__(
        self,
        folder,
        model_config: ModelConfig,
        config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
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
        self.block_size = config.block_size
        self.kv_cache = torch.empty(0)
        self.kv_scales: torch.Tensor | None = None
        self.graphs: DecodeGraphs | None = None
        self.kernel_choices = KernelChoices()  # this engine's alone (engine/tuning.py)
        self.max_blocks_per_seq = -(-config.max_model_len // config.block_size)

    def allocate_kv_cache(self, num_blocks: int, kv_dtype: torch.dtype) -> None:
        """Allocate the paged pool and bind each attention layer's K/V views."""
        cfg = self.model_config
        self.kv_cache = torch.zeros(
            cfg.num_layers,
            2,
            num_blocks,
            self.block_size,
            cfg.num_kv_heads,
            cfg.head_dim,
            dtype=kv_dtype,
            device=self.device,
        )  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        self.kv_scales = None
        if kv_dtype == torch.int8:
            # [num_layers, 2, num_blocks, block_size, num_kv_heads]
            self.kv_scales = torch.zeros(
                self.kv_cache.shape[:-1], dtype=KV_SCALE_DTYPE, device=self.device
            )
        backend = select_backend(self.device)
        for i, attn in enumerate(self.model.attention_layers()):
            attn.k_cache, attn.v_cache = self.kv_cache[i, 0], self.kv_cache[i, 1]
            attn.k_scales = attn.v_scales = None
            if self.kv_scales is not None:
                attn.k_scales, attn.v_scales = self.kv_scales[i, 0], self.kv_scales[i, 1]
            attn.backend = backend
        self.backend = backend

    def capture_cuda_graphs(self) -> None:
        """Time the decode kernels, then capture decode graphs for the batch-size ladder (CUDA;
        enforce_eager: the batch-1 GEMV configs only, no graphs)."""
        if self.device.type != "cuda" or self.backend.name != "triton":
            return
        eager, max_rows = self.config.enforce_eager, self.config.max_num_seqs
        choose_kernels(self.model, self.kernel_choices, self.dtype, max_rows, eager)
        if eager:
            return
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
        )
        self.graphs.capture()

    # --- execution ---------------------------------------------------------------------------
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: copy KV block src to dst in every layer (and its int8 scales)."""
        for src, dst in copies:
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]
            if self.kv_scales is not None:
                self.kv_scales[:, :, dst] = self.kv_scales[:, :, src]

    def run(self, batch: ScheduledBatch) -> dict[int, tuple[int, Logprob | None]]:
        """Run one batch and wait for it; returns batch index -> (sampled token, logprob) for
        each request that reached the end of its known tokens."""
        return self.launch(batch).collect()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, prev: PendingStep | None = None) -> PendingStep:
        """Queue one batch on the device without waiting for it. Decodes whose input token is
        still pending read it from `prev` (the step launched just before) on the device."""
        self.copy_blocks(batch.block_copies)
        input_ids, positions, meta, logits_rows, fill = prepare_inputs(
            batch, self.block_size, self.device, prev.rows if prev is not None else None
        )
        if fill is not None:
            fill.apply(input_ids, prev.out.token_ids)
        if self.graphs is not None and batch.num_decodes == len(batch.requests) <= (
            self.graphs.max_batch
        ):
            hidden = self.graphs.run(input_ids, positions, meta)
        else:
            with forward_context(meta):
                hidden = self.model(input_ids, positions)  # [num_tokens, hidden]
        sampling_rows = batch.sampling_indices
        if not sampling_rows:
            return PendingStep.launched(batch, sampling_rows, None)
        reqs = [batch.requests[i] for i in sampling_rows]
        logits = self.model.compute_logits(hidden[logits_rows])  # [num_sampling, vocab]
        out = sample(logits, prepare_sampling(reqs, self.model_config.vocab_size, self.device))
        return PendingStep.launched(batch, sampling_rows, out)
