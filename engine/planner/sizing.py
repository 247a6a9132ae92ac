"""The plan's stages 4-7, once the weights and KV dtype are chosen: the KV blocks,
max_model_len, max_num_seqs and the state pool; then the finished Plan with every reason."""

from __future__ import annotations

from math import floor

from engine.planner.formulas import (
    expert_bytes,
    kv_bytes_per_token,
    size_text,
    token_bytes_in_block,
)
from engine.planner.plan_request import Plan
from engine.planner.plan_state import Misfit, PlanPass


def kv_blocks(d: PlanPass) -> None:
    """Stage 4: every block the pool holds, unless pinned; the CPU class's cap."""
    req, dev, bs = d.req, d.dev, d.bs
    d.kv_tok = kv_bytes_per_token(d.m, d.kv_dtype)
    d.draft_kv_tok = token_bytes_in_block(d.m, d.kv_dtype, req.draft_model) - d.kv_tok
    d.block_bytes = bs * (d.kv_tok + d.draft_kv_tok)
    pool_blocks = max(0, d.room) // d.block_bytes
    d.left = size_text(d.room)
    if pool_blocks < 1:
        culprit = "quantization" if req.quantization else "gpu_memory_utilization"
        held = [f"{d.format_name} weights ({size_text(d.weights)})"]
        if d.state_seq:
            culprit = "max_num_seqs" if req.max_num_seqs else culprit
            slots = f"{d.slots} slot{'s' if d.slots != 1 else ''}"
            held.append(f"a state pool of {slots} ({size_text(d.slots * d.state_seq)})")
        if d.draft_weights:
            held.append(f"a draft model ({size_text(d.draft_weights)})")
        if d.vision_weights:
            held.append(f"a vision encoder's weights ({size_text(d.vision_weights)})")
        held.append(f"overheads ({size_text(d.fixed)})")
        raise Misfit(
            3,
            culprit,
            f"{', '.join(held[:-1])} and {held[-1]} leave no room for a KV cache in "
            f"{size_text(d.budget)}",
        )
    if req.num_kv_blocks is not None and req.num_kv_blocks > pool_blocks:
        raise Misfit(
            4,
            "num_kv_blocks",
            f"num_kv_blocks={req.num_kv_blocks} needs "
            f"{size_text(req.num_kv_blocks * d.block_bytes)}; "
            f"{size_text(pool_blocks * d.block_bytes)} is left after weights and overheads",
        )
    d.blocks = req.num_kv_blocks or pool_blocks
    capped = dev.max_kv_bytes is not None and d.blocks > dev.max_kv_bytes // d.block_bytes
    if capped and req.num_kv_blocks is None:
        # The CPU's pool is zero-filled RAM shared with everything else; past the class's cap a
        # CPU could not decode fast enough to fill it anyway (profiles/gpus/cpu.toml).
        # Soft: pinned lengths still get their blocks (the memory checks below stay in force).
        seqs = (req.max_num_seqs or 1) if req.max_model_len else 1
        pinned_need = -(-(req.max_model_len or 1) // bs) * seqs
        d.blocks = min(d.blocks, max(1, dev.max_kv_bytes // d.block_bytes, pinned_need))
        d.why["num_kv_blocks"] = (
            f"the class KV cap, {size_text(dev.max_kv_bytes)} of {d.left} left (CPU)"
        )


def max_model_len(d: PlanPass) -> None:
    """Stage 5: the model's maximum, or the longest the pool holds min_seqs_at_max_len times."""
    req, bs, blocks = d.req, d.bs, d.blocks
    if req.max_model_len is not None:
        d.max_len = req.max_model_len
        if -(-d.max_len // bs) > blocks:
            raise Misfit(
                5,
                "max_model_len",
                f"max_model_len={d.max_len} needs {-(-d.max_len // bs)} KV blocks "
                f"({size_text(-(-d.max_len // bs) * d.block_bytes)}) for one sequence; the "
                f"pool holds {blocks} ({blocks * bs} tokens, "
                f"{size_text(blocks * d.block_bytes)})",
                blocks * bs if blocks > 0 else None,
            )
        d.why["max_model_len"] = "pinned"
    else:
        fits = (blocks // req.min_seqs_at_max_len or blocks) * bs
        d.max_len = min(d.limit, fits if fits < 256 else fits // 256 * 256)
        held = blocks // -(-d.max_len // bs)
        d.why["max_model_len"] = (
            f"the model's maximum; memory for {held} sequences that long"
            if d.max_len == d.limit
            else f"the longest with memory for {held} of them (model maximum {d.limit})"
        )
    d.per_seq = -(-d.max_len // bs)
    d.typical = min(req.typical_len, d.max_len)  # no request is longer than max_model_len


def max_num_seqs(d: PlanPass) -> None:
    """Stage 6: as many typical requests as the pool holds, up to the class's cap."""
    req, dev = d.req, d.dev
    if req.max_num_seqs is not None:
        d.seqs = req.max_num_seqs
        d.why["max_num_seqs"] = "pinned"
        held = d.blocks // d.per_seq
        if d.seqs > held:  # allowed: the scheduler preempts when the pool runs out, nothing OOMs
            d.why["max_num_seqs"] = (
                f"pinned; the pool holds {held} sequences of max_model_len at once (past that "
                "the scheduler preempts)"
            )
    else:
        by_typical = d.blocks // -(-d.typical // d.bs)
        seqs = max(1, min(floor(d.rows), by_typical))
        d.seqs = seqs // 8 * 8 if seqs >= 8 else seqs
        held, what = by_typical, "memory"
        if d.state_seq:  # the rows were sized with a state slot per request
            held, what = min(by_typical, max(1, floor(d.rows))), "KV and state memory"
        d.why["max_num_seqs"] = (
            f"{what} for {held} requests of a typical {d.typical} "
            f"tokens (class cap {dev.max_num_seqs})"
        )
    if dev.kind == "cpu" and req.num_kv_blocks is None and d.seqs * d.per_seq < d.blocks:
        d.blocks = d.seqs * d.per_seq  # RAM is shared: never more than the worst case needs
        d.why["num_kv_blocks"] = f"every one of {d.seqs} sequences at {d.max_len} tokens (CPU)"


def state_pool(d: PlanPass) -> None:
    """Stage 7: the state pool holds one slot per max_num_seqs sequence; the slots reserved
    beyond that (max_num_seqs rounds down) go back to the KV pool, unless the blocks are
    pinned or capped."""
    d.state_pool = d.seqs * d.state_seq
    spare = max(0, d.slots - d.seqs) * d.state_seq
    if spare and d.req.num_kv_blocks is None and "num_kv_blocks" not in d.why:
        d.blocks += spare // d.block_bytes
        d.room += spare
        d.left = size_text(d.room)


AUTO_DTYPE_REASONS = {
    "float32": "the CPU engine computes in float32",
    "bfloat16": "this GPU supports bfloat16",
    "float16": "this GPU has no bfloat16",
}


def finish(d: PlanPass) -> Plan:
    req, why = d.req, d.why
    chunk = f"the class's prefill chunk; activation peak {size_text(d.act)}"
    why["max_num_batched_tokens"] = "pinned" if req.max_num_batched_tokens else chunk
    why["dtype"] = "pinned" if req.dtype else AUTO_DTYPE_REASONS[d.dtype]
    if req.gpu_memory_utilization:
        why["gpu_memory_utilization"] = "pinned"
    elif d.dev.kind == "cpu":
        why["gpu_memory_utilization"] = "the CPU profile's share of the available RAM"
    else:
        why["gpu_memory_utilization"] = "class default"
    why["block_size"] = "tokens per KV-cache block"
    why.setdefault(
        "num_kv_blocks",
        "pinned" if req.num_kv_blocks else f"{d.left} left / {d.bs} tokens x {d.kv_tok} B a token",
    )
    if req.draft_model is not None:
        why["num_kv_blocks"] += (
            f"; each block also holds the draft model's K/V ({d.draft_kv_tok} B a token), "
            f"and its weights take {size_text(d.draft_weights)}"
        )
    if d.state_seq:
        why["max_num_seqs"] += (
            f"; a state slot each: {size_text(d.state_seq)} a sequence, "
            f"{size_text(d.state_pool)} in all"
        )
    return Plan(
        device=d.dev.kind,
        dtype=d.dtype,
        quantization=d.fmt,
        kv_cache_dtype=d.kv_dtype,
        max_model_len=d.max_len,
        max_num_seqs=d.seqs,
        max_num_batched_tokens=d.tokens,
        block_size=d.bs,
        num_kv_blocks=d.blocks,
        gpu_memory_utilization=d.util,
        total_bytes=d.dev.total_bytes,
        budget_bytes=d.budget,
        weight_bytes=d.weights,
        activation_bytes=d.act,
        graph_pool_bytes=d.graphs,
        allocator_bytes=d.allocator,
        cuda_context_bytes=d.context,
        margin_bytes=d.margin,
        kv_pool_bytes=d.blocks * d.block_bytes,
        kv_bytes_per_token=d.kv_tok,
        typical_len=d.typical,
        concurrency_at_max_len=d.blocks // d.per_seq,
        concurrency_at_typical_len=d.blocks // -(-d.typical // d.bs),
        target_met=d.target_met,
        reasons=why,
        weight_format=d.format_name,
        bandwidth_gbs=d.dev.bandwidth_gbs,
        bandwidth_source=d.dev.bandwidth_source,
        num_params=d.m.num_params,
        num_active_params=d.m.num_active_params,
        expert_bytes=expert_bytes(d.m, d.fmt, d.dtype_bytes, d.req.quant_block_size),
        num_experts=d.m.num_experts,
        num_experts_per_tok=d.m.num_experts_per_tok,
        state_bytes_per_sequence=d.state_seq,
        state_pool_bytes=d.state_pool,
        draft_weight_bytes=d.draft_weights,
        draft_kv_bytes_per_token=d.draft_kv_tok,
        vision_weight_bytes=d.vision_weights,
        vision_activation_bytes=d.vision_act,
    )
