"""CUDA graphs for decode steps: the model forward captured once per batch size of a ladder
(engine.planner.formulas.graph_batch_sizes, by which the planner sizes the graph pool) and
replayed with padded inputs.

Padding rows get slot -1 (their K/V is not stored) and seq_len 0 (attention returns zeros),
so they never touch real sequences; in a model with linear-attention layers they also get
state slot -1 (the kernels neither read nor write it). Logits and sampling run after the
replay, eagerly.
"""

from __future__ import annotations

import gc

import torch

from engine.planner.formulas import graph_batch_sizes
from engine.runner.forward_context import AttentionMetadata, forward_context


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        max_model_len: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        num_splits: dict[int, int],
        has_state: bool = False,
    ) -> None:
        """has_state: the model has linear-attention layers (each row carries its state slot
        and fresh flag)."""
        self.model = model
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        self.num_splits = num_splits  # batch size -> fixed decode split count
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.hidden = torch.zeros(n, hidden_size, dtype=dtype, device=device)
        self.state_slots = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.state_fresh = torch.zeros(n, dtype=torch.bool, device=device)
        self.has_state = has_state
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def _meta(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            num_decodes=bs,
            max_query_len=1,
            max_seq_len=self.max_model_len,
            query_start_loc_cpu=list(range(bs + 1)),
            seq_lens_cpu=[0] * bs,
            decode_num_splits=self.num_splits[bs],
            state_slots=self.state_slots[:bs] if self.has_state else None,
            state_fresh=self.state_fresh[:bs] if self.has_state else None,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first (the smaller graphs reuse its memory pool).

        Python's garbage collector stays off meanwhile: collecting an unreachable engine's
        graphs frees device memory, which would invalidate the capture in progress."""
        gc.collect()
        gc.disable()
        try:
            self._capture_all()
        finally:
            gc.enable()

    def _capture_all(self) -> None:
        for bs in reversed(self.sizes):
            meta = self._meta(bs)
            with forward_context(meta):
                self.hidden[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])  # warm-up
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self.hidden[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def run(
        self,
        input_ids: torch.Tensor,  # [n]
        positions: torch.Tensor,  # [n]
        meta: AttentionMetadata,  # of the real (unpadded) decode batch
    ) -> torch.Tensor:  # [n, hidden]
        n = input_ids.shape[0]
        bs = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[n:bs].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[n:bs].fill_(0)
        width = meta.block_tables.shape[1]
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        if self.has_state:
            self.state_slots[:n].copy_(meta.state_slots, non_blocking=True)
            self.state_slots[n:bs].fill_(-1)
            self.state_fresh[:n].copy_(meta.state_fresh, non_blocking=True)
        self.graphs[bs].replay()
        return self.hidden[:n]
