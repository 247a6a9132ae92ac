"""plan(): from a device budget and a model shape to engine settings, by arithmetic.

The budget splits as (docs/design.md, "Memory: the KV-cache formula and the planner"):

    budget    = total x utilization - memory other processes hold
    KV pool   = budget - weights - activation peak - CUDA graph pool - CUDA context
                - allocator cache - margin - state pool
    KV blocks = KV pool // (block_size x KV bytes per token)
    KV bytes per token = 2 (K and V) x layers holding K/V x KV heads x head_dim x bytes
    state pool = max_num_seqs x state bytes per sequence (a hybrid model's linear layers:
                 fp32 recurrent state + conv state; 0 without linear layers)

Choices, in order, each with a one-line reason: the weight format (the best that leaves room for
target_num_seqs sequences of useful_context tokens), the KV dtype, the KV blocks,
max_model_len, max_num_seqs and max_num_batched_tokens, then the state pool's slots. Pinned
values are kept; pins that cannot fit raise PlanError naming one setting and the value to give
it (engine.planner.refusal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil, floor

from engine.models.config import ModelConfig
from engine.planner.device import Device
from engine.planner.formulas import (
    ELEMENT_BYTES,
    MIN_SAFETY_BYTES,
    SAFETY_FRACTION,
    WEIGHT_FORMATS,
    activation_bytes,
    allocator_bytes,
    expert_bytes,
    graph_batch_sizes,
    graph_pool_bytes,
    kv_bytes_per_token,
    model_length_limit,
    size_text,
    state_bytes_per_sequence,
    token_bytes_in_block,
    weight_bytes,
)
from engine.planner.request import Plan, PlanRequest

FORMAT_NAMES = {"none": None, "int8": "int8", "int4": "int4 (NF4)"}
"""How reasons name a weight format (None: the activation dtype's name)."""


class Misfit(Exception):
    """One planning pass failed; `stage` says how far it got (a later stage is progress)."""

    def __init__(self, stage: int, culprit: str, why: str, bound: object = None) -> None:
        super().__init__(why)
        self.stage, self.culprit, self.why = stage, culprit, why
        self.bound = bound
        """The culprit's own limit, suggested when no single change makes everything fit."""


@dataclass
class _Draft:
    """One planning pass's state: inputs, then each step's choices and reasons."""

    m: ModelConfig
    dev: Device
    req: PlanRequest
    seqs_cap: int
    """The most sequences to plan: the pinned max_num_seqs, or the class's cap."""
    why: dict[str, str] = field(default_factory=dict)

    @property
    def bs(self) -> int:
        return self.req.block_size


def attempt(m: ModelConfig, dev: Device, req: PlanRequest) -> Plan:
    """Plan once; raises Misfit naming the setting at fault."""
    d = _Draft(m, dev, req, req.max_num_seqs or dev.max_num_seqs)
    _budget(d)
    _weights_and_kv_dtype(d)
    _kv_blocks(d)
    _max_model_len(d)
    _max_num_seqs(d)
    _state_pool(d)
    return _finish(d)


def _budget(d: _Draft) -> None:
    """Stage 1-2: the dtype, the model's length limit, the budget and the fixed overheads."""
    dev, req = d.dev, d.req
    d.util = req.gpu_memory_utilization or dev.utilization
    d.budget = int(dev.total_bytes * d.util) - dev.used_bytes
    auto = "float32" if dev.kind == "cpu" else "bfloat16" if dev.bf16_supported else "float16"
    d.dtype = req.dtype or auto
    if d.dtype == "bfloat16" and not dev.bf16_supported:
        raise Misfit(1, "dtype", f"{dev.name} has no bfloat16", "float16")
    d.dtype_bytes = ELEMENT_BYTES[d.dtype]
    d.state_seq = state_bytes_per_sequence(d.m, d.dtype_bytes)
    d.draft_weights = (
        0
        if req.draft_model is None
        else weight_bytes(req.draft_model, "none", d.dtype_bytes, False)
    )
    d.limit, why = model_length_limit(d.m, dev.kind)
    if req.max_model_len is not None and req.max_model_len > d.limit:
        raise Misfit(
            2,
            "max_model_len",
            f"max_model_len={req.max_model_len} exceeds {why} ({d.limit} tokens)",
            d.limit,
        )
    d.tokens = req.max_num_batched_tokens or max(dev.max_num_batched_tokens, d.seqs_cap)
    d.eager = dev.kind == "cpu" or req.enforce_eager
    d.context = dev.cuda_context_bytes if dev.kind == "cuda" else 0
    d.margin = max(MIN_SAFETY_BYTES, int(SAFETY_FRACTION * d.budget))


def _overheads(d: _Draft, fmt: str, rows: float) -> dict[str, int]:
    """The activation peak, allocator cache and graph pool, sized for `rows` sequences."""
    act = activation_bytes(d.m, d.tokens, rows, d.dtype_bytes, fmt)
    if d.dev.kind == "cpu":
        return {"act": act, "alloc": 0, "graphs": 0}
    # one graph per batch size of the ladder up to the cap: a count that does not step with
    # the sequences sized for
    ladder = len(graph_batch_sizes(d.seqs_cap))
    return {
        "act": act,
        "alloc": allocator_bytes(d.m, d.tokens, rows, d.dtype_bytes, fmt),
        "graphs": 0 if d.eager else graph_pool_bytes(d.m, rows, d.dtype_bytes, ladder),
    }


def _sized_rooms(d: _Draft, options: list, weights: dict) -> tuple[dict, dict, dict]:
    """Per option (KV dtype, weight format): the sequences its overheads are sized for, the
    state-pool slots reserved for them (whole slots), and the room left for its KV cache. A
    pinned max_num_seqs sizes them for itself. Otherwise they are sized for the typical
    requests (KV blocks and a state slot each) the option's memory holds with overheads sized
    for the class's cap (at most that cap, unrounded: the count grows smoothly with memory, so
    a little more memory never plans fewer blocks), and the memory that frees goes to the KV
    cache."""
    fixed = d.context + d.margin
    typical = min(d.req.typical_len, d.limit, d.req.max_model_len or d.limit)
    rows, slots, room = {}, {}, {}
    for kv, fmt in options:
        capped = d.budget - fixed - weights[fmt] - sum(_overheads(d, fmt, d.seqs_cap).values())
        rows[kv, fmt] = float(d.seqs_cap)
        if d.req.max_num_seqs is None:
            per_token = token_bytes_in_block(d.m, kv, d.req.draft_model)
            request = -(-typical // d.bs) * d.bs * per_token + d.state_seq
            rows[kv, fmt] = min(float(d.seqs_cap), max(1.0, capped / request))
        used = sum(_overheads(d, fmt, rows[kv, fmt]).values())
        slots[kv, fmt] = ceil(rows[kv, fmt])
        room[kv, fmt] = d.budget - fixed - weights[fmt] - used - slots[kv, fmt] * d.state_seq
    return rows, slots, room


def _weights_and_kv_dtype(d: _Draft) -> None:
    """Stage 3: the first (best) weight format and KV dtype that leave room for the target:
    the best weights first, with an int8 KV cache before lower-precision weights (eval-quant on
    SmolLM2: int8 KV moved perplexity by -0.02%, int8 weights -0.08%, int4 weights +19%)."""
    m, req, bs = d.m, d.req, d.bs
    d.useful = min(req.useful_context, d.limit, req.max_model_len or d.limit)
    target_tokens = req.target_num_seqs * -(-d.useful // bs) * bs
    formats = [req.quantization] if req.quantization else list(WEIGHT_FORMATS)
    kv_dtypes = [req.kv_cache_dtype] if req.kv_cache_dtype else [d.dtype]
    if not req.kv_cache_dtype and req.allow_int8_kv:
        kv_dtypes.append("int8")
    options = [(kv, f) for f in formats for kv in kv_dtypes]
    weights = {  # a draft model's (16-bit) weights come with every format
        f: weight_bytes(m, f, d.dtype_bytes, req.quantize_embeddings, req.quant_block_size)
        + d.draft_weights
        for f in formats
    }
    rows, slots, room = _sized_rooms(d, options, weights)
    # the target's KV, and the state of the target's sequences beyond the slots reserved
    unreserved = {o: max(0, req.target_num_seqs - slots[o]) * d.state_seq for o in options}
    per_token = {o: token_bytes_in_block(m, o[0], req.draft_model) for o in options}
    need = {o: target_tokens * per_token[o] + unreserved[o] for o in options}
    fit = [o for o in options if room[o] >= need[o]]
    d.kv_dtype, d.fmt = chosen = fit[0] if fit else options[-1]
    d.weights, d.room, d.rows = weights[d.fmt] - d.draft_weights, room[chosen], rows[chosen]
    d.target_met = bool(fit)
    d.slots = slots[chosen]
    sized = _overheads(d, d.fmt, d.rows)
    d.act, d.allocator, d.graphs = sized["act"], sized["alloc"], sized["graphs"]
    d.fixed = d.act + d.allocator + d.graphs + d.context + d.margin
    name = {f: FORMAT_NAMES[f] or d.dtype for f in WEIGHT_FORMATS}
    of = "of KV and state" if d.state_seq else "of KV"
    target = f"{req.target_num_seqs} x {d.useful} tokens ({size_text(need[chosen])} {of})"
    best, w = options[0], size_text(d.weights)
    if req.quantization:
        d.why["quantization"] = f"{name[d.fmt]} weights ({w}): pinned"
    elif fit and d.fmt == best[1]:
        d.why["quantization"] = f"{name[d.fmt]} weights ({w}) leave room for {target}"
    elif fit:
        d.why["quantization"] = (
            f"{name[best[1]]} weights leave {size_text(room[best])}, short of "
            f"{target}; {name[d.fmt]} weights ({w}) leave room"
        )
    else:
        d.why["quantization"] = (
            f"no weight format leaves room for {target} ({name[best[1]]} weights leave "
            f"{size_text(room[best])}); {name[d.fmt]} ({w}) leaves the most: {size_text(d.room)}"
        )
    if req.kv_cache_dtype:
        d.why["kv_cache_dtype"] = "pinned"
    elif d.kv_dtype == d.dtype:
        d.why["kv_cache_dtype"] = f"{d.kv_dtype} KV: the activation dtype, full precision"
    else:
        short = size_text(room[(d.dtype, d.fmt)])
        d.why["kv_cache_dtype"] = (
            f"int8 KV: with a 16-bit KV cache {name[d.fmt]} weights "
            f"leave {short}, short of {target}"
        )
    d.format_name = name[d.fmt]


def _kv_blocks(d: _Draft) -> None:
    """Stage 4: every block the pool holds, unless pinned; the CPU class's cap."""
    req, dev, bs = d.req, d.dev, d.bs
    d.kv_tok = kv_bytes_per_token(d.m, d.kv_dtype)
    d.draft_kv_tok = token_bytes_in_block(d.m, d.kv_dtype, req.draft_model) - d.kv_tok
    d.block_bytes = bs * (d.kv_tok + d.draft_kv_tok)
    pool_blocks = max(0, d.room) // d.block_bytes
    d.left = size_text(d.room)
    if pool_blocks < 1:
        culprit = "quantization" if req.quantization else "gpu_memory_utilization"
        state = ""
        if d.state_seq:
            culprit = "max_num_seqs" if req.max_num_seqs else culprit
            slots = f"{d.slots} slot{'s' if d.slots != 1 else ''}"
            state = f", a state pool of {slots} ({size_text(d.slots * d.state_seq)}),"
        if d.draft_weights:
            state += f" a draft model ({size_text(d.draft_weights)}),"
        raise Misfit(
            3,
            culprit,
            f"{d.format_name} weights ({size_text(d.weights)}) and overheads "
            f"({size_text(d.fixed)}){state} leave no room for a KV cache in "
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


def _max_model_len(d: _Draft) -> None:
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


def _max_num_seqs(d: _Draft) -> None:
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


def _state_pool(d: _Draft) -> None:
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


def _finish(d: _Draft) -> Plan:
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
    )
