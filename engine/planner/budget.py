"""The plan's stages 1-3: the dtype, the length limit, the budget and the fixed overheads, then
the weight format and KV dtype that leave room for the target (engine/planner/plan_state.py
holds the pass they fill)."""

from __future__ import annotations

from math import ceil

from engine.planner.formulas import (
    ELEMENT_BYTES,
    MIN_SAFETY_BYTES,
    SAFETY_FRACTION,
    WEIGHT_FORMATS,
    activation_bytes,
    allocator_bytes,
    graph_batch_sizes,
    graph_pool_bytes,
    layout_for,
    layout_text,
    model_length_limit,
    size_text,
    state_bytes_per_sequence,
    token_bytes_in_block,
    weight_bytes,
)
from engine.planner.plan_state import FORMAT_NAMES, Misfit, PlanPass
from engine.planner.vision_bytes import vision_activation_bytes, vision_weight_bytes


def budget(d: PlanPass) -> None:
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
    d.vision_act = vision_activation_bytes(
        d.m, d.dtype_bytes, req.max_encoder_tokens, req.max_image_pixels, req.max_images_per_request
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


def _overheads(d: PlanPass, fmt: str, rows: float) -> dict[str, int]:
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


def _sized_rooms(d: PlanPass, options: list, weights: dict) -> tuple[dict, dict, dict]:
    """Per option (KV dtype, weight format): the sequences its overheads are sized for, the
    state-pool slots reserved for them (whole slots), and the room left for its KV cache. A
    pinned max_num_seqs sizes them for itself. Otherwise they are sized for the typical
    requests (KV blocks and a state slot each) the option's memory holds with overheads sized
    for the class's cap (at most that cap, unrounded: the count grows smoothly with memory, so
    a little more memory never plans fewer blocks), and the memory that frees goes to the KV
    cache."""
    fixed = d.context + d.margin + d.vision_act
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


def weights_and_kv_dtype(d: PlanPass) -> None:
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
    layout = req.checkpoint_layout  # a quantized checkpoint's formats list only its own
    vision = {
        f: vision_weight_bytes(m, f, d.dtype_bytes, req.quant_block_size, layout) for f in formats
    }
    weights = {  # a draft model's (16-bit) weights and the vision encoder's come with every format
        f: weight_bytes(m, f, d.dtype_bytes, req.quantize_embeddings, req.quant_block_size, layout)
        + d.draft_weights
        + vision[f]
        for f in formats
    }
    rows, slots, room = _sized_rooms(d, options, weights)
    # the target's KV, and the state of the target's sequences beyond the slots reserved
    unreserved = {o: max(0, req.target_num_seqs - slots[o]) * d.state_seq for o in options}
    per_token = {o: token_bytes_in_block(m, o[0], req.draft_model) for o in options}
    need = {o: target_tokens * per_token[o] + unreserved[o] for o in options}
    fit = [o for o in options if room[o] >= need[o]]
    d.kv_dtype, d.fmt = chosen = fit[0] if fit else options[-1]
    d.vision_weights = vision[d.fmt]
    d.weights = weights[d.fmt] - d.draft_weights - d.vision_weights
    d.room, d.rows = room[chosen], rows[chosen]
    d.target_met = bool(fit)
    d.slots = slots[chosen]
    sized = _overheads(d, d.fmt, d.rows)
    d.act, d.allocator, d.graphs = sized["act"], sized["alloc"], sized["graphs"]
    d.fixed = d.act + d.allocator + d.graphs + d.context + d.margin + d.vision_act
    name = {f: FORMAT_NAMES[f] or d.dtype for f in FORMAT_NAMES}
    if layout is not None and layout.name:
        name[d.fmt] = layout.name
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
    if d.fmt != "none":
        shown = layout or layout_for(d.fmt, req.quant_block_size)
        d.format_name = f"{name[d.fmt]}, {layout_text(shown)}"
