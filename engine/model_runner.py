"""ModelRunner: every device concern. Owns the model, the KV-cache tensor, input preparation,
attention metadata and sampling-tensor preparation; runs one scheduled batch per call.

KV cache: one tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]; each
attention layer gets its K and V views (see engine/kernels/torch_ref.py for the layout).
"""

from __future__ import annotations

import torch

from engine.attention import select_backend
from engine.config import EngineConfig
from engine.context import AttentionMetadata, forward_context
from engine.models.config import ModelConfig
from engine.models.loader import load_model
from engine.request import Logprob, Request
from engine.sampler import SamplingTensors, sample
from engine.scheduler import ScheduledBatch


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
            folder, model_config, config.max_model_len, dtype, device,
            random_weights=config.load_format == "random",
        )
        self.block_size = config.block_size
        self.kv_cache = torch.empty(0)
        self.max_blocks_per_seq = -(-config.max_model_len // config.block_size)

    def allocate_kv_cache(self, num_blocks: int, kv_dtype: torch.dtype) -> None:
        """Allocate the paged pool and bind each attention layer's K/V views."""
        cfg = self.model_config
        self.kv_cache = torch.zeros(
            cfg.num_layers, 2, num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=kv_dtype, device=self.device,
        )  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        backend = select_backend(self.device)
        for i, attn in enumerate(self.model.attention_layers()):
            attn.k_cache, attn.v_cache = self.kv_cache[i, 0], self.kv_cache[i, 1]
            attn.backend = backend

    # --- input preparation -----------------------------------------------------------------
    def prepare_inputs(
        self, batch: ScheduledBatch
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        logits_indices: list[int] = []
        bs = self.block_size
        for i, (req, num_new) in enumerate(zip(batch.requests, batch.num_new_tokens)):
            start = req.num_computed_tokens
            end = start + num_new
            input_ids.extend(req.token_ids[start:end])
            positions.extend(range(start, end))
            table = req.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            query_start_loc.append(query_start_loc[-1] + num_new)
            seq_lens.append(end)
            if batch.samples(i):
                logits_indices.append(query_start_loc[-1] - 1)
        max_blocks = max(len(r.block_table) for r in batch.requests)
        tables = [r.block_table + [0] * (max_blocks - len(r.block_table)) for r in batch.requests]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            num_decodes=batch.num_decodes,
            max_query_len=max(batch.num_new_tokens),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=query_start_loc,
            seq_lens_cpu=seq_lens,
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return ids, pos, meta, logits_indices

    def prepare_sampling(self, reqs: list[Request]) -> SamplingTensors:
        dev = self.device
        vocab = self.model_config.vocab_size
        params = [r.params for r in reqs]
        temperature = [p.temperature for p in params]
        top_k = [p.top_k if p.top_k > 0 else vocab for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        wants_logprobs = [p.logprobs for p in params if p.logprobs is not None]
        t = SamplingTensors(
            temperature=torch.tensor(temperature, dtype=torch.float32, device=dev),
            top_k=torch.tensor(top_k, dtype=torch.int64, device=dev),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=dev),
            min_p=torch.tensor(min_p, dtype=torch.float32, device=dev),
            seeds=torch.tensor([r.seed for r in reqs], dtype=torch.int64, device=dev),
            steps=torch.tensor([r.num_output_tokens for r in reqs], dtype=torch.int64, device=dev),
            all_greedy=all(x == 0.0 for x in temperature),
            any_top_k=any(k < vocab for k in top_k),
            any_top_p=any(p < 1.0 for p in top_p),
            any_min_p=any(m > 0.0 for m in min_p),
            max_logprobs=max(wants_logprobs) if wants_logprobs else None,
        )
        if any(p.has_penalties for p in params):
            self._prepare_penalties(t, reqs)
        return t

    def _prepare_penalties(self, t: SamplingTensors, reqs: list[Request]) -> None:
        dev, vocab, n = self.device, self.model_config.vocab_size, len(reqs)
        params = [r.params for r in reqs]
        t.repetition = torch.tensor([p.repetition_penalty for p in params], device=dev)
        t.presence = torch.tensor([p.presence_penalty for p in params], device=dev)
        t.frequency = torch.tensor([p.frequency_penalty for p in params], device=dev)
        counts = torch.zeros(n, vocab, dtype=torch.float32, device=dev)
        seen = torch.zeros(n, vocab, dtype=torch.bool, device=dev)
        for i, r in enumerate(reqs):
            out = torch.tensor(r.output_token_ids, dtype=torch.int64, device=dev)
            counts[i].index_add_(0, out, torch.ones(len(out), device=dev))
            seen[i, torch.tensor(r.token_ids, dtype=torch.int64, device=dev)] = True
        t.output_counts, t.seen_mask = counts, seen

    # --- execution ---------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> dict[int, tuple[int, Logprob | None]]:
        """Run one batch; returns batch index -> (sampled token, logprob) for each request that
        reached the end of its known tokens."""
        for src, dst in batch.block_copies:
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]
        input_ids, positions, meta, logits_indices = self.prepare_inputs(batch)
        with forward_context(meta):
            hidden = self.model(input_ids, positions)  # [num_tokens, hidden]
        if not logits_indices:
            return {}
        sampling_rows = [i for i in range(len(batch.requests)) if batch.samples(i)]
        reqs = [batch.requests[i] for i in sampling_rows]
        logits = self.model.compute_logits(hidden[logits_indices])  # [num_sampling, vocab]
        out = sample(logits, self.prepare_sampling(reqs))
        tokens = out.token_ids.tolist()
        result: dict[int, tuple[int, Logprob | None]] = {}
        if out.logprobs is None:
            for row, i in enumerate(sampling_rows):
                result[i] = (tokens[row], None)
            return result
        chosen = out.logprobs.tolist()
        top_ids, top_lps = out.top_ids.tolist(), out.top_logprobs.tolist()
        for row, (i, req) in enumerate(zip(sampling_rows, reqs)):
            n = req.params.logprobs
            logprob = None
            if n is not None:
                top = list(zip(top_ids[row][:n], top_lps[row][:n]))
                logprob = Logprob(tokens[row], chosen[row], top)
            result[i] = (tokens[row], logprob)
        return result
