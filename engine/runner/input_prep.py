"""Turning a scheduled batch into device tensors: token ids, positions, attention metadata,
sampling settings. Everything goes up in one pinned, non-blocking copy per dtype, so preparing
a step never waits for the GPU."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from engine.runner.forward_context import AttentionMetadata
from engine.runner.sampler import SamplingTensors
from engine.scheduling.request import Request
from engine.scheduling.scheduler import ScheduledBatch


@dataclass
class PendingFill:
    """input_ids[dst] = previous step's sampled tokens[src], done on the device."""

    dst: torch.Tensor  # [num_filled] int64 rows of input_ids
    src: torch.Tensor  # [num_filled] int64 rows of the previous step's token_ids

    def apply(self, input_ids: torch.Tensor, prev_tokens: torch.Tensor) -> None:
        input_ids.index_copy_(0, self.dst, prev_tokens.index_select(0, self.src))


_NUMPY = {torch.int64: np.int64, torch.float32: np.float32}


def upload(lists: list[list], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Copy several Python lists to `device` in one transfer; returns one 1-D view per list.
    (numpy reads the lists without building one flat Python list: about 2x faster than
    torch.tensor on a 256-sequence step.)"""
    sizes = [len(values) for values in lists]
    flat = np.fromiter(chain.from_iterable(lists), dtype=_NUMPY[dtype], count=sum(sizes))
    host = torch.from_numpy(flat)
    if device.type == "cuda":
        host = host.pin_memory().to(device, non_blocking=True)
    return list(host.split(sizes))


def prepare_inputs(
    batch: ScheduledBatch,
    block_size: int,
    device: torch.device,
    pending_rows: dict[int, int] | None = None,
    multimodal_positions: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, PendingFill | None]:
    """(input_ids [T], positions [T], metadata, logits_rows [num_logits], fill): logits_rows
    is the hidden-state row of each request that samples this step (the rows of all 1 + d
    query tokens of a decode with d drafted tokens, engine/spec/step.py). A decode whose input
    token is still on the device (a PLACEHOLDER) takes it from the previous step's sampled
    tokens: `pending_rows` maps id(request) -> its row there, and `fill` says where it goes.
    multimodal_positions: the model may take 3-D positions (Qwen3.5 with images,
    Request.mrope); positions is then [3, T] where a prompt row with images is in the batch."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    fill_dst: list[int] = []
    fill_src: list[int] = []
    for req, num_new in zip(batch.requests, batch.num_new_tokens):
        start = req.num_computed_tokens
        end = start + num_new
        if req.num_pending:
            if num_new != 1 or pending_rows is None or id(req) not in pending_rows:
                raise RuntimeError(f"request {req.request_id}: input token not read back yet")
            fill_dst.append(len(input_ids))
            fill_src.append(pending_rows[id(req)])
        table = req.block_table
        if num_new == 1:  # the common case (decode), without the generic loop's overhead
            input_ids.append(req.token_ids[start])
            positions.append(start)
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            input_ids.extend(req.token_ids[start:end])
            input_ids.extend(req.spec_tokens)  # drafted tokens follow a decode's last token
            positions.extend(range(start, end))
            slots.extend(
                table[p // block_size] * block_size + p % block_size for p in range(start, end)
            )
        query_start_loc.append(query_start_loc[-1] + num_new)
        seq_lens.append(end)
    if multimodal_positions:
        positions = _multimodal_positions(batch, positions)
    logits_indices = [  # a decode with d drafts: its last d + 1 rows
        row
        for i in batch.sampling_indices
        for row in range(
            query_start_loc[i + 1] - 1 - len(batch.requests[i].spec_tokens), query_start_loc[i + 1]
        )
    ]
    max_blocks = max(len(r.block_table) for r in batch.requests)
    pad = [0] * max_blocks
    tables: list[int] = []
    for r in batch.requests:
        tables += r.block_table
        tables += pad[: max_blocks - len(r.block_table)]
    state = _state_lists(batch)  # [] for a model without linear-attention layers
    ids, pos, slot_mapping, qsl, lens, flat_tables, logits_rows, dst, src, *state = upload(
        [input_ids, positions, slots, query_start_loc, seq_lens, tables, logits_indices]
        + [fill_dst, fill_src]
        + state,
        torch.int64,
        device,
    )
    if len(pos) != len(ids):  # [3, num_tokens]: multimodal RoPE positions
        pos = pos.view(3, len(ids))
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
    if state:
        meta.state_slots, meta.state_fresh = state[0], state[1].bool()
    return ids, pos, meta, logits_rows, PendingFill(dst, src) if fill_dst else None


def _multimodal_positions(batch: ScheduledBatch, positions: list[int]) -> list[int]:
    """The batch's positions where some request has multimodal RoPE positions (Request.mrope):
    its generated tokens' index + delta; and, where a row of such a request lies in its
    prompt, the three axes' lists [temporal..., height..., width...] for the whole batch."""
    positions = list(positions)
    prompt_rows: list[tuple[int, int, torch.Tensor]] = []  # (row, prompt index, [3, n] table)
    row = 0
    for req, num_new in zip(batch.requests, batch.num_new_tokens):
        if req.mrope is not None:
            table, delta = req.mrope
            start, num_prompt = req.num_computed_tokens, req.num_prompt_tokens
            for k in range(num_new):
                if start + k < num_prompt:
                    prompt_rows.append((row + k, start + k, table))
                else:
                    positions[row + k] = start + k + delta
        row += num_new
    if not prompt_rows:
        return positions
    axes = [list(positions), list(positions), list(positions)]
    for r, index, table in prompt_rows:
        for axis in range(3):
            axes[axis][r] = int(table[axis, index])
    return axes[0] + axes[1] + axes[2]


def _state_lists(batch: ScheduledBatch) -> list[list[int]]:
    """[state slots, fresh flags] of the batch's sequences when they hold state slots (a
    model with linear-attention layers): fresh (1) for a sequence's first chunk, which starts
    from a zero state; [] when they hold none."""
    reqs = batch.requests
    if reqs[0].state_slot is None:
        return []
    slots = [r.state_slot for r in reqs]
    if None in slots:
        missing = reqs[slots.index(None)].request_id
        raise RuntimeError(f"request {missing} was scheduled without a state slot")
    return [slots, [int(r.num_computed_tokens == 0) for r in reqs]]


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
    if any(r.has_penalties for r in reqs):
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
