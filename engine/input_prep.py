"""Turning a scheduled batch into device tensors: token ids, positions, attention metadata,
sampling settings. Everything goes up in one pinned, non-blocking copy per dtype, so preparing
a step never waits for the GPU."""

from __future__ import annotations

import torch

from engine.context import AttentionMetadata
from engine.request import Request
from engine.sampler import SamplingTensors
from engine.scheduler import ScheduledBatch


def upload(lists: list[list], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Copy several Python lists to `device` in one transfer; returns one 1-D view per list."""
    flat = [x for values in lists for x in values]
    host = torch.tensor(flat, dtype=dtype)
    if device.type == "cuda":
        host = host.pin_memory().to(device, non_blocking=True)
    sizes = [len(values) for values in lists]
    return list(host.split(sizes))


def prepare_inputs(
    batch: ScheduledBatch, block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """(input_ids [T], positions [T], metadata, logits_rows [num_sampling]): the hidden-state
    row of each request that samples this step."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    for req, num_new in zip(batch.requests, batch.num_new_tokens):
        start = req.num_computed_tokens
        end = start + num_new
        input_ids.extend(req.token_ids[start:end])
        positions.extend(range(start, end))
        table = req.block_table
        slots.extend(
            table[p // block_size] * block_size + p % block_size for p in range(start, end)
        )
        query_start_loc.append(query_start_loc[-1] + num_new)
        seq_lens.append(end)
    logits_indices = [query_start_loc[i + 1] - 1 for i in batch.sampling_indices]
    max_blocks = max(len(r.block_table) for r in batch.requests)
    tables = [
        x for r in batch.requests for x in r.block_table + [0] * (max_blocks - len(r.block_table))
    ]
    ids, pos, slot_mapping, qsl, lens, flat_tables, logits_rows = upload(
        [input_ids, positions, slots, query_start_loc, seq_lens, tables, logits_indices],
        torch.int64,
        device,
    )
    meta = AttentionMetadata(
        slot_mapping=slot_mapping,
        query_start_loc=qsl.to(torch.int32),
        seq_lens=lens.to(torch.int32),
        block_tables=flat_tables.to(torch.int32).view(len(seq_lens), max_blocks),
        num_decodes=batch.num_decodes,
        max_query_len=max(batch.num_new_tokens),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
    )
    return ids, pos, meta, logits_rows


def prepare_sampling(reqs: list[Request], vocab: int, device: torch.device) -> SamplingTensors:
    params = [r.params for r in reqs]
    temperature = [p.temperature for p in params]
    top_k = [p.top_k if p.top_k > 0 else vocab for p in params]
    top_p = [p.top_p for p in params]
    min_p = [p.min_p for p in params]
    wants_logprobs = [p.logprobs for p in params if p.logprobs is not None]
    floats = upload([temperature, top_p, min_p], torch.float32, device)
    ints = upload(
        [top_k, [r.seed for r in reqs], [r.num_output_tokens for r in reqs]], torch.int64, device
    )
    t = SamplingTensors(
        temperature=floats[0],
        top_p=floats[1],
        min_p=floats[2],
        top_k=ints[0],
        seeds=ints[1],
        steps=ints[2],
        all_greedy=all(x == 0.0 for x in temperature),
        any_top_k=any(k < vocab for k in top_k),
        any_top_p=any(p < 1.0 for p in top_p),
        any_min_p=any(m > 0.0 for m in min_p),
        max_logprobs=max(wants_logprobs) if wants_logprobs else None,
    )
    if any(p.has_penalties for p in params):
        _prepare_penalties(t, reqs, vocab, device)
    return t


def _prepare_penalties(
    t: SamplingTensors, reqs: list[Request], vocab: int, device: torch.device
) -> None:
    params = [r.params for r in reqs]
    t.repetition, t.presence, t.frequency = upload(
        [
            [p.repetition_penalty for p in params],
            [p.presence_penalty for p in params],
            [p.frequency_penalty for p in params],
        ],
        torch.float32,
        device,
    )
    # [num_seqs, vocab] occurrence counts of output tokens, and seen-anywhere mask
    outputs = [r.output_token_ids for r in reqs]
    rows = [i for i, out in enumerate(outputs) for _ in out]
    out_rows, out_ids = upload([rows, [x for out in outputs for x in out]], torch.int64, device)
    counts = torch.zeros(len(reqs), vocab, dtype=torch.float32, device=device)
    counts.index_put_(
        (out_rows, out_ids), torch.ones_like(out_rows, dtype=torch.float32), accumulate=True
    )
    all_rows = [i for i, r in enumerate(reqs) for _ in r.token_ids]
    seen_rows, seen_ids = upload(
        [all_rows, [x for r in reqs for x in r.token_ids]], torch.int64, device
    )
    seen = torch.zeros(len(reqs), vocab, dtype=torch.bool, device=device)
    seen[seen_rows, seen_ids] = True
    t.output_counts, t.seen_mask = counts, seen
