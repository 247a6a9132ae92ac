"""The memory planner: from a device budget and a model shape to engine settings, by arithmetic.

No model is loaded and torch is not imported. The budget splits as (DESIGN.md, "The KV-cache
formula"):

    budget    = total x utilization - memory other processes hold
    KV pool   = budget - weights - activation peak - CUDA graph pool - CUDA context - margin
    KV blocks = KV pool // (block_size x KV bytes per token)
    KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes per element

Choices, in order, each with a one-line reason: the weight format (the best that leaves room for
target_num_seqs sequences of useful_context tokens), the KV dtype, max_model_len, max_num_seqs
and max_num_batched_tokens, the number of KV blocks. Pinned values are kept; pins that cannot
fit raise PlanError naming one setting and the value to give it.
"""

from __future__ import annotations

from dataclasses import replace

from appliance.plan_model import (
    CPU_MAX_MODEL_LEN,
    ELEMENT_BYTES,
    GIB,
    MIN_SAFETY_BYTES,
    SAFETY_FRACTION,
    WEIGHT_FORMATS,
    Device,
    Plan,
    PlanError,
    PlanRequest,
    activation_bytes,
    gib,
    graph_pool_bytes,
    kv_bytes_per_token,
    weight_bytes,
)
from engine.models.config import ModelConfig

__all__ = ["Device", "Plan", "PlanError", "PlanRequest", "plan"]


class _Misfit(Exception):
    def __init__(self, stage: int, culprit: str, why: str, bound: object = None) -> None:
        super().__init__(why)
        self.stage, self.culprit, self.why = stage, culprit, why
        """stage: which check failed, in _attempt's order (a later stage is progress)."""
        self.bound = bound
        """The culprit's own limit, suggested when no single change makes everything fit."""


def _attempt(
    m: ModelConfig, dev: Device, req: PlanRequest, seqs_ceiling: int | None = None
) -> Plan:
    """One planning pass; raises _Misfit naming the setting at fault. seqs_ceiling: size the
    activation peak and the graph pool for this many sequences (not the class's cap) and choose
    at most that many (plan's second pass)."""
    bs, why = req.block_size, {}
    util = req.gpu_memory_utilization or dev.utilization
    budget = int(dev.total_bytes * util) - dev.used_bytes
    auto_dtype = "float32" if dev.kind == "cpu" else "bfloat16" if dev.bf16_supported else "float16"
    dtype = req.dtype or auto_dtype
    if dtype == "bfloat16" and not dev.bf16_supported:
        raise _Misfit(1, "dtype", f"{dev.name} has no bfloat16", "float16")
    a = ELEMENT_BYTES[dtype]
    limit = m.max_position_embeddings
    if m.sliding_window is not None:
        limit = min(limit, m.sliding_window)  # sliding-window attention is not implemented
    if dev.kind == "cpu":
        limit = min(limit, CPU_MAX_MODEL_LEN)
    if req.max_model_len is not None and req.max_model_len > limit:
        raise _Misfit(
            2,
            "max_model_len",
            f"max_model_len={req.max_model_len} exceeds the model's maximum of {limit} tokens",
            limit,
        )
    seqs_cap = req.max_num_seqs or seqs_ceiling or dev.max_num_seqs
    tokens = req.max_num_batched_tokens or max(dev.max_num_batched_tokens, seqs_cap)
    act = req.measured_activation_bytes or activation_bytes(m, tokens, seqs_cap, a)
    graphs = 0 if dev.kind == "cpu" or req.enforce_eager else graph_pool_bytes(m, seqs_cap, a)
    context = dev.cuda_context_bytes if dev.kind == "cuda" else 0
    margin = max(MIN_SAFETY_BYTES, int(SAFETY_FRACTION * budget))
    fixed = act + graphs + context + margin

    # 1. weight format, 2. KV dtype: the first (best) pair that leaves room for the target:
    # the best weights first, with an int8 KV cache before lower-precision weights (eval-quant
    # on SmolLM2: int8 KV moved perplexity by -0.02%, int8 weights -0.08%, int4 weights +19%).
    useful = min(req.useful_context, limit, req.max_model_len or limit)
    target_tokens = req.target_num_seqs * -(-useful // bs) * bs
    formats = [req.quantization] if req.quantization else list(WEIGHT_FORMATS)
    kv_dtypes = [req.kv_cache_dtype] if req.kv_cache_dtype else [dtype]
    if not req.kv_cache_dtype and req.allow_int8_kv:
        kv_dtypes.append("int8")
    options = [(kv, f) for f in formats for kv in kv_dtypes]
    room = {o: budget - fixed - weight_bytes(m, o[1], a, req.quantize_embeddings) for o in options}
    need = {o: target_tokens * kv_bytes_per_token(m, o[0]) for o in options}
    fit = [o for o in options if room[o] >= need[o]]
    kv_dtype, fmt = fit[0] if fit else options[-1]
    weights = budget - fixed - room[(kv_dtype, fmt)]
    target = f"{req.target_num_seqs} x {useful} tokens ({gib(need[(kv_dtype, fmt)])} of KV)"
    name = {"none": dtype, "int8": "int8", "int4": "int4 (NF4-style)"}
    best = options[0]
    if req.quantization:
        why["quantization"] = f"{name[fmt]} weights ({gib(weights)}): pinned"
    elif fit and fmt == best[1]:
        why["quantization"] = f"{name[fmt]} weights ({gib(weights)}) leave room for {target}"
    elif fit:
        why["quantization"] = (
            f"{name[best[1]]} weights leave {gib(room[best])}, short of "
            f"{target}; {name[fmt]} weights ({gib(weights)}) leave room"
        )
    else:
        why["quantization"] = (
            f"no weight format leaves room for {target}; {name[fmt]} "
            f"({gib(weights)}) leaves the most: {gib(room[(kv_dtype, fmt)])}"
        )
    why["kv_cache_dtype"] = (
        "pinned"
        if req.kv_cache_dtype
        else f"{kv_dtype} KV: the activation dtype, full precision"
        if kv_dtype == dtype
        else f"int8 KV: with a 16-bit KV cache {name[fmt]} weights leave "
        f"{gib(room[(dtype, fmt)])}, short of {target}"
        if (dtype, fmt) in room
        else "int8 KV"
    )
    kv_tok = kv_bytes_per_token(m, kv_dtype)
    block_bytes = bs * kv_tok
    pool_blocks = max(0, room[(kv_dtype, fmt)]) // block_bytes
    left_of = gib(room[(kv_dtype, fmt)])
    if pool_blocks < 1:
        culprit = "quantization" if req.quantization else "gpu_memory_utilization"
        raise _Misfit(
            3,
            culprit,
            f"{name[fmt]} weights ({gib(weights)}) and overheads "
            f"({gib(fixed)}) leave no room for a KV cache in {gib(budget)}",
        )

    # 6 (bounds first). the KV blocks: every block the pool holds, unless pinned.
    if req.num_kv_blocks is not None and req.num_kv_blocks > pool_blocks:
        raise _Misfit(
            4,
            "num_kv_blocks",
            f"num_kv_blocks={req.num_kv_blocks} needs "
            f"{gib(req.num_kv_blocks * block_bytes)}; {gib(pool_blocks * block_bytes)} "
            "is left after weights and overheads",
        )
    blocks = req.num_kv_blocks or pool_blocks
    capped = dev.max_kv_bytes is not None and blocks > dev.max_kv_bytes // block_bytes
    if capped and req.num_kv_blocks is None:
        # The CPU's pool is zero-filled RAM shared with everything else; past the class's cap a
        # CPU could not decode fast enough to fill it anyway (profiles/gpus/cpu.toml).
        # Soft: pinned lengths still get their blocks (the memory checks below stay in force).
        pinned_need = -(-(req.max_model_len or 1) // bs) * (
            req.max_num_seqs or 1 if req.max_model_len else 1
        )
        blocks = min(blocks, max(1, dev.max_kv_bytes // block_bytes, pinned_need))
        why["num_kv_blocks"] = f"the class KV cap, {gib(dev.max_kv_bytes)} of {left_of} left (CPU)"

    # 3. max_model_len: the model's maximum, or the longest the pool holds min_seqs times.
    if req.max_model_len is not None:
        max_len = req.max_model_len
        if -(-max_len // bs) > blocks:
            raise _Misfit(
                5,
                "max_model_len",
                f"max_model_len={max_len} needs "
                f"{gib(-(-max_len // bs) * block_bytes)} of KV for one sequence; the "
                f"pool holds {gib(blocks * block_bytes)}",
                blocks * bs if blocks > 0 else None,
            )
        why["max_model_len"] = "pinned"
    else:
        fits = (blocks // req.min_seqs_at_max_len or blocks) * bs
        max_len = min(limit, fits if fits < 256 else fits // 256 * 256)
        held = blocks // -(-max_len // bs)
        why["max_model_len"] = (
            f"the model's maximum; memory for {held} sequences that long"
            if max_len == limit
            else f"the longest with memory for {held} of them (model maximum {limit})"
        )
    per_seq = -(-max_len // bs)
    typical = min(req.typical_len, max_len)  # no request is longer than max_model_len

    # 4. max_num_seqs: as many typical requests as the pool holds, up to the class's cap.
    if req.max_num_seqs is not None:
        seqs = req.max_num_seqs
        # A pinned pool may be oversubscribed on purpose: the scheduler preempts, nothing OOMs.
        if req.max_model_len is not None and req.num_kv_blocks is None and seqs * per_seq > blocks:
            raise _Misfit(
                6,
                "max_num_seqs",
                f"max_num_seqs={seqs} x max_model_len={max_len} "
                f"needs {gib(seqs * per_seq * block_bytes)} of KV; the pool holds "
                f"{gib(blocks * block_bytes)}",
            )
        why["max_num_seqs"] = "pinned"
    else:
        by_typical = blocks // -(-typical // bs)
        seqs = max(1, min(seqs_cap, by_typical))
        seqs = seqs // 8 * 8 if seqs >= 8 else seqs
        why["max_num_seqs"] = (
            f"memory for {by_typical} requests of a typical "
            f"{typical} tokens (class cap {dev.max_num_seqs})"
        )
    if dev.kind == "cpu" and req.num_kv_blocks is None and seqs * per_seq < blocks:
        blocks = seqs * per_seq  # RAM is shared: never more than the worst case needs
        why["num_kv_blocks"] = f"every one of {seqs} sequences at {max_len} tokens (CPU)"
    how = "measured" if req.measured_activation_bytes else "estimated"
    chunk = f"the class's prefill chunk; activation peak {gib(act)} ({how})"
    why["max_num_batched_tokens"] = "pinned" if req.max_num_batched_tokens else chunk
    auto_why = {
        "float32": "the CPU engine computes in float32",
        "bfloat16": "this GPU supports bfloat16",
        "float16": "this GPU has no bfloat16",
    }
    why["dtype"] = "pinned" if req.dtype else auto_why[dtype]
    why["gpu_memory_utilization"] = "pinned" if req.gpu_memory_utilization else "class default"
    why["block_size"] = "tokens per KV-cache block"
    why.setdefault(
        "num_kv_blocks",
        "pinned" if req.num_kv_blocks else f"{left_of} left / {bs} tokens x {kv_tok} B per token",
    )
    typical_held = blocks // -(-typical // bs)
    return Plan(
        device=dev.kind,
        dtype=dtype,
        quantization=fmt,
        kv_cache_dtype=kv_dtype,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        block_size=bs,
        num_kv_blocks=blocks,
        gpu_memory_utilization=util,
        total_bytes=dev.total_bytes,
        budget_bytes=budget,
        weight_bytes=weights,
        activation_bytes=act,
        activation_measured=req.measured_activation_bytes is not None,
        graph_pool_bytes=graphs,
        cuda_context_bytes=context,
        margin_bytes=margin,
        kv_pool_bytes=blocks * block_bytes,
        kv_bytes_per_token=kv_tok,
        typical_len=typical,
        concurrency_at_max_len=blocks // per_seq,
        concurrency_at_typical_len=typical_held,
        target_met=bool(fit),
        reasons=why,
    )


def plan(model: ModelConfig, device: Device, request: PlanRequest | None = None) -> Plan:
    """Plan, or raise PlanError naming the one setting to change and the value to give it."""
    req = request or PlanRequest()
    try:
        return _tightened(model, device, req, _attempt(model, device, req))
    except _Misfit as exc:
        misfit = exc
    setting, value = _fix(model, device, req, misfit)
    if setting == "memory_gib":
        raise PlanError(f"{misfit.why}: use a device with at least {value} GiB", setting, value)
    if value is None:
        raise PlanError(f"{misfit.why}: change {setting}", setting, value)
    raise PlanError(f"{misfit.why}: set {setting} to {value}", setting, value)


def _tightened(m: ModelConfig, dev: Device, req: PlanRequest, first: Plan) -> Plan:
    """The first pass sizes the activation peak and the graph pool for the class's max_num_seqs;
    where it chose fewer, plan again with them sized for its choice (and no more sequences),
    so the memory they no longer need goes to the KV pool. By this arithmetic a 24 GiB card
    with Llama-3-8B plans 48 sequences, not 256, and 4,020 KV blocks instead of 3,277."""
    if req.max_num_seqs is not None or first.max_num_seqs >= dev.max_num_seqs:
        return first
    try:
        return _attempt(m, dev, req, seqs_ceiling=first.max_num_seqs)
    except _Misfit:  # cannot happen with more room, but the first plan is sound
        return first


FITS = 99
"""Stage of a plan that passed every check."""


def _stage(m: ModelConfig, dev: Device, req: PlanRequest, **change: object) -> int:
    """How far planning gets with the change: the failing check's stage, or FITS."""
    try:
        _attempt(m, dev, replace(req, **change))
    except _Misfit as misfit:
        return misfit.stage
    return FITS


def _largest(ok, lo: int, hi: int) -> int | None:
    """Largest v in [lo, hi] with ok(v), for ok true up to some threshold and false after."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _candidate(m: ModelConfig, dev: Device, req: PlanRequest, name: str, need: int):
    """A value of one setting that gets planning as far as that setting alone can, and at
    least to stage `need` (FITS: the plan fits), every other pin kept; or None."""
    now = getattr(req, name)

    def reached(value: object) -> int:
        return _stage(m, dev, req, **{name: value})

    if name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens"):
        if now is None or now <= 1:
            return None
        # smaller is more relaxed, but not always furthest (a tiny max_model_len changes the
        # derived batch budget): probe powers of two for how far lowering alone gets
        probes = [1 << i for i in range((now - 1).bit_length()) if 1 << i < now]
        stages = {v: reached(v) for v in probes}
        goal = max(stages.values())
        if goal < need:
            return None
        lo = max(v for v, st in stages.items() if st >= goal)
        v = _largest(lambda v: reached(v) >= goal, lo, now - 1)
        return v // 256 * 256 if v and v >= 256 else v  # a round number fits too
    if name == "num_kv_blocks":
        per_seq = -(-(req.max_model_len or 1) // req.block_size)
        options = [per_seq * ((req.max_num_seqs or 1) if req.max_model_len else 1)]
        try:
            options.insert(0, _attempt(m, dev, replace(req, num_kv_blocks=None)).num_kv_blocks)
        except _Misfit:
            pass
    elif name == "gpu_memory_utilization":
        options = [u / 100 for u in range(round(100 * (now or dev.utilization)) + 1, 96)]
    elif name == "quantization":
        options = WEIGHT_FORMATS[WEIGHT_FORMATS.index(now) + 1 :] if now else ()
    elif name == "kv_cache_dtype":
        options = ("int8",) if req.allow_int8_kv and now != "int8" else ()
    else:
        options = tuple(d for d in ("bfloat16", "float16") if d != now)
    stages = [(reached(v), v) for v in options if v != now]
    goal = max((st for st, _ in stages), default=0)
    return next((v for st, v in stages if st >= goal), None) if goal >= need else None


def _fix(m: ModelConfig, dev: Device, req: PlanRequest, misfit: _Misfit) -> tuple[str, object]:
    """The first single change that makes everything fit: the culprit, the other pins, the
    utilization, the device memory. When none does (two independent problems), the first that
    gets past this misfit; the next run names the next one."""
    culprit = misfit.culprit
    order = [culprit] if culprit in req.pinned else []
    for need in (FITS, misfit.stage + 1):
        for name in dict.fromkeys([*order, *req.pinned, "gpu_memory_utilization"]):
            value = _candidate(m, dev, req, name, need)
            if value is not None:
                return name, value

        def reached(g: int) -> int:
            return _stage(m, replace(dev, total_bytes=g * GIB), req)

        lo, hi = dev.total_bytes // GIB + 1, 1 << 16
        goal = max(need, reached(hi))  # as far as memory alone can get
        if reached(hi) >= need:
            while lo < hi:  # the smallest memory that gets there
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if reached(mid) >= goal else (mid + 1, hi)
            return "memory_gib", lo
    return culprit, misfit.bound
