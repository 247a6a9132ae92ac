"""plan(): one pass through the stages (attempt) and, when the pins cannot fit, the refusal: the
one setting to change and the value to give it (or the device memory that would fit), so the
error says "set X to V"."""

from __future__ import annotations

from dataclasses import replace

from engine.models.model_config import ModelConfig
from engine.planner.budget import budget, weights_and_kv_dtype
from engine.planner.device import Device
from engine.planner.formulas import GIB, WEIGHT_FORMATS
from engine.planner.plan_request import Plan, PlanError, PlanRequest
from engine.planner.plan_state import Misfit, PlanPass
from engine.planner.sizing import finish, kv_blocks, max_model_len, max_num_seqs, state_pool

FITS = 99
"""Stage of a plan that passed every check."""


def attempt(m: ModelConfig, dev: Device, req: PlanRequest) -> Plan:
    """Plan once, stage by stage; raises Misfit naming the setting at fault."""
    d = PlanPass(m, dev, req, req.max_num_seqs or dev.max_num_seqs)
    budget(d)
    weights_and_kv_dtype(d)
    kv_blocks(d)
    max_model_len(d)
    max_num_seqs(d)
    state_pool(d)
    return finish(d)


def plan(model: ModelConfig, device: Device, request: PlanRequest | None = None) -> Plan:
    """Plan, or raise PlanError naming the one setting to change and the value to give it."""
    req = request or PlanRequest()
    try:
        return attempt(model, device, req)
    except Misfit as exc:
        misfit = exc
    setting, value = _fix(model, device, req, misfit)
    if setting == "memory_gib":
        raise PlanError(f"{misfit.why}: use a device with at least {value} GiB", setting, value)
    if value is None:
        raise PlanError(f"{misfit.why}: change {setting}", setting, value)
    raise PlanError(f"{misfit.why}: set {setting} to {value}", setting, value)


def _stage(m: ModelConfig, dev: Device, req: PlanRequest, **change: object) -> int:
    """How far planning gets with the change: the failing check's stage, or FITS."""
    try:
        attempt(m, dev, replace(req, **change))
    except Misfit as misfit:
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


def _lowered(m: ModelConfig, dev: Device, req: PlanRequest, name: str, need: int):
    """The largest value below a pinned count that gets planning as far as lowering it can."""
    now = getattr(req, name)
    if now is None or now <= 1:
        return None

    def reached(value: object) -> int:
        return _stage(m, dev, req, **{name: value})

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


def _options(m: ModelConfig, dev: Device, req: PlanRequest, name: str) -> tuple:
    """Values to try for a setting that is not a count to lower."""
    now = getattr(req, name)
    if name == "num_kv_blocks":
        per_seq = -(-(req.max_model_len or 1) // req.block_size)
        options = [per_seq * ((req.max_num_seqs or 1) if req.max_model_len else 1)]
        try:
            options.insert(0, attempt(m, dev, replace(req, num_kv_blocks=None)).num_kv_blocks)
        except Misfit:
            pass
        return tuple(options)
    if name == "gpu_memory_utilization":
        return tuple(u / 100 for u in range(round(100 * (now or dev.utilization)) + 1, 96))
    if name == "quantization":
        if req.checkpoint_layout is not None or now not in WEIGHT_FORMATS:
            return ()  # a quantized checkpoint's format is its own
        return WEIGHT_FORMATS[WEIGHT_FORMATS.index(now) + 1 :]
    if name == "kv_cache_dtype":
        return ("int8",) if req.allow_int8_kv and now != "int8" else ()
    return tuple(d for d in ("bfloat16", "float16") if d != now)  # dtype


def _candidate(m: ModelConfig, dev: Device, req: PlanRequest, name: str, need: int):
    """A value of one setting that gets planning as far as that setting alone can, and at
    least to stage `need` (FITS: the plan fits), every other pin kept; or None."""
    if name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens"):
        return _lowered(m, dev, req, name, need)
    now = getattr(req, name)
    stages = [(_stage(m, dev, req, **{name: v}), v) for v in _options(m, dev, req, name)]
    stages = [(st, v) for st, v in stages if v != now]
    goal = max((st for st, _ in stages), default=0)
    return next((v for st, v in stages if st >= goal), None) if goal >= need else None


def _fix(m: ModelConfig, dev: Device, req: PlanRequest, misfit: Misfit) -> tuple[str, object]:
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
