"""The memory planner on synthetic GPUs: the source article's arithmetic, GQA, monotonic plans,
and refusals that name the one number to change (and whose suggestion then fits)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.models.model_config import ModelConfig
from engine.planner import GIB, WEIGHT_FORMATS, Device, PlanError, PlanRequest, plan, plan_settings
from engine.planner.formulas import kv_bytes_per_token, weight_bytes

KIB = 1024
PRESETS = Path(__file__).resolve().parent.parent / "profiles" / "models"


def preset(name: str) -> ModelConfig:
    return ModelConfig.from_dict(json.loads((PRESETS / f"{name}.json").read_text()))


LLAMA2, LLAMA3, QWEN3 = preset("llama-2-7b"), preset("llama-3-8b"), preset("qwen3-0.6b")


def gpu(gib: float, **kw) -> Device:
    return Device(kind="cuda", name=f"synthetic {gib} GiB", total_bytes=int(gib * GIB), **kw)


def test_article_kv_arithmetic_llama2_fp16():
    # 2 x 32 layers x 32 heads x 128 x 2 B = 512 KiB per token; x 2048 x 16 = 16 GiB
    per_token = kv_bytes_per_token(LLAMA2, "float16")
    assert per_token == 512 * KIB
    assert per_token * 2048 * 16 == 16 * GIB
    assert 12.5 * GIB < weight_bytes(LLAMA2, "none", 2, False) < 14 * GIB  # "about 14 GB"


def test_gqa_uses_kv_heads_not_attention_heads():
    assert kv_bytes_per_token(LLAMA3, "bfloat16") == 128 * KIB  # 8 KV heads of 32
    assert kv_bytes_per_token(LLAMA3, "int8") < 128 * KIB // 2 + 8 * KIB


def test_quantized_weights_shrink_and_keep_16bit_embeddings():
    full = weight_bytes(LLAMA3, "none", 2, False)
    int8, int4 = weight_bytes(LLAMA3, "int8", 2, False), weight_bytes(LLAMA3, "int4", 2, False)
    embed = 2 * LLAMA3.vocab_size * LLAMA3.hidden_size * 2  # embeddings + LM head, 16-bit
    assert full > int8 > int4 > embed
    assert int8 - embed == pytest.approx((full - embed) / 2, rel=0.01)  # ~1 B/param + scales
    # 0.5 B/param plus a 4-byte (fp32) scale per 64 weights, as QuantLinear stores them
    assert int4 - embed == pytest.approx((full - embed) / 2 * (0.5 + 4 / 64), rel=0.01)
    assert weight_bytes(LLAMA3, "int8", 2, True) < int8


def test_24gb_card_cannot_hold_batch16_x_2048_in_fp16_and_says_why():
    req = PlanRequest(target_num_seqs=16, useful_context=2048, kv_cache_dtype="bfloat16")
    p = plan(LLAMA2, gpu(24), req)
    assert p.quantization != "none"  # 14 GB of weights + 16 GiB of KV do not fit in 24 GB
    assert "16 x 2048 tokens (16.00 GiB of KV)" in p.reasons["quantization"]
    assert "float16" in p.reasons["quantization"] or "bfloat16" in p.reasons["quantization"]
    # int4 weights leave nearly the 16 GiB: 31 requests of 1,024 tokens (16 x 2048 = 32 x 1024
    # less the allocator cache and fp32 int4 scales the plan now counts)
    assert p.kv_pool_bytes > 15 * GIB and p.concurrency_at_typical_len >= 16 * 2 - 1


def test_int8_kv_comes_before_lower_precision_weights():
    # Unpinned, the same card: int8 KV with 16-bit weights is tried before int8 weights, and
    # int8 KV with int8 weights before int4 weights (eval-quant's measured quality order).
    p = plan(LLAMA2, gpu(24), PlanRequest(target_num_seqs=16, useful_context=2048))
    assert (p.quantization, p.kv_cache_dtype) == ("int8", "int8") and p.target_met
    assert "short of 16 x 2048 tokens" in p.reasons["kv_cache_dtype"]


def test_24gb_card_with_fp16_pinned_picks_a_smaller_batch():
    # the article's arithmetic is for a 16-bit KV cache: pin it
    req = PlanRequest(
        target_num_seqs=16, useful_context=2048, quantization="none", kv_cache_dtype="bfloat16"
    )
    p = plan(LLAMA2, gpu(24), req)
    assert p.quantization == "none" and not p.target_met
    assert 7 * GIB < p.kv_pool_bytes < 9 * GIB  # the article's "about 8 GB left for KV"
    fit_at_2048 = p.num_kv_blocks // (2048 // p.block_size)
    assert 4 <= fit_at_2048 < 16
    assert p.max_num_seqs < 16
    assert "pinned" in p.reasons["quantization"]


def test_pinned_16_bit_weights_that_leave_too_little_room_get_an_int8_kv_cache():
    req = PlanRequest(target_num_seqs=16, useful_context=2048, quantization="none")
    p = plan(LLAMA2, gpu(24), req)
    assert p.quantization == "none" and p.kv_cache_dtype == "int8"
    assert p.kv_bytes_per_token == 512 * 1024 // 2 + 2 * 32 * 32 * 2  # half, plus fp16 scales
    assert p.max_num_seqs >= 16


def test_article_batch8_x_1024_fits_fp16_on_24gb():
    p = plan(LLAMA2, gpu(24), PlanRequest(target_num_seqs=8, useful_context=1024))
    assert p.quantization == "none" and p.target_met  # 4 GB of KV: "still room to spare"
    assert p.kv_bytes_per_token * 8 * 1024 == 4 * GIB


def test_int8_before_int4():
    # Llama-3-8B on an 18 GiB budget: bf16 weights leave too little, int8 is enough.
    p = plan(LLAMA3, gpu(20))
    assert p.quantization == "int8" and p.target_met
    assert "short of 8 x 4096 tokens" in p.reasons["quantization"]


def test_plan_arithmetic_adds_up():
    p = plan(LLAMA3, gpu(80))
    assert p.quantization == "none" and p.kv_cache_dtype == "bfloat16"
    assert p.max_model_len == LLAMA3.max_position_embeddings
    parts = p.weight_bytes + p.activation_bytes + p.graph_pool_bytes + p.cuda_context_bytes
    parts += p.allocator_bytes
    assert p.kv_pool_bytes == p.num_kv_blocks * p.block_size * p.kv_bytes_per_token
    assert parts + p.margin_bytes + p.kv_pool_bytes <= p.budget_bytes
    assert p.budget_bytes - parts - p.margin_bytes - p.kv_pool_bytes < p.block_size * 128 * KIB
    assert p.concurrency_at_max_len == p.num_kv_blocks // (p.max_model_len // p.block_size)
    assert set(p.engine_kwargs()) <= set(p.reasons) | {"block_size"}
    assert all(p.reasons.values())


def test_a_sliding_window_does_not_cap_max_model_len():
    """Sliding-window layers run past their window: the model's max_position_embeddings is the
    limit, and every token of a sequence still holds a block (the block manager keeps a sliding
    layer's blocks), so the KV bytes per token are those of a full model."""
    mistral = replace(preset("mistral-7b"), sliding_window=4096)
    p = plan(mistral, gpu(80))
    assert p.max_model_len == mistral.max_position_embeddings == 32768
    assert p.reasons["max_model_len"] and "sliding" not in p.reasons["max_model_len"]
    assert p.kv_bytes_per_token == kv_bytes_per_token(preset("mistral-7b"), p.kv_cache_dtype)


def test_memory_in_use_by_others_shrinks_the_pool():
    free = plan(LLAMA3, gpu(80))
    busy = plan(LLAMA3, gpu(80, used_bytes=10 * GIB))
    assert busy.num_kv_blocks < free.num_kv_blocks


def test_no_bf16_gpu_plans_float16():
    p = plan(QWEN3, gpu(15, bf16_supported=False))
    assert p.dtype == "float16" and p.kv_cache_dtype == "float16"
    with pytest.raises(PlanError, match="set dtype to float16"):
        plan(QWEN3, gpu(15, bf16_supported=False), PlanRequest(dtype="bfloat16"))


def test_cpu_plan_is_float32_and_capped_at_the_worst_case():
    cpu = Device(kind="cpu", name="cpu", total_bytes=16 * GIB, utilization=0.5, max_num_seqs=16)
    p = plan(QWEN3, cpu)
    assert p.dtype == "float32" and p.graph_pool_bytes == 0 and p.cuda_context_bytes == 0
    assert p.max_model_len == 8192
    assert p.num_kv_blocks <= p.max_num_seqs * p.max_model_len // p.block_size


def quality(p) -> tuple[int, int]:
    return WEIGHT_FORMATS.index(p.quantization), p.kv_cache_dtype == "int8"


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from([LLAMA2, LLAMA3, QWEN3]),
    small=st.floats(2, 160),
    extra=st.floats(0.01, 100),
    pins=st.fixed_dictionaries(
        {},
        optional={
            "quantization": st.sampled_from(WEIGHT_FORMATS),
            "max_num_seqs": st.integers(1, 64),
            "max_model_len": st.sampled_from([512, 2048, 4096]),
            "enforce_eager": st.booleans(),
        },
    ),
)
def test_more_memory_never_yields_a_smaller_plan(model, small, extra, pins):
    req = PlanRequest(**pins)

    def attempt(gib):
        try:
            return plan(model, gpu(gib), req)
        except PlanError:
            return None

    a, b = attempt(small), attempt(small + extra)
    if a is None:
        return
    assert b is not None, "a plan that fits must still fit with more memory"
    assert quality(b) <= quality(a), "more memory chose a lower-quality format"
    assert b.target_met >= a.target_met
    if quality(a) == quality(b):
        for name in ("num_kv_blocks", "max_model_len", "max_num_seqs"):
            assert getattr(b, name) >= getattr(a, name), name
        if b.max_model_len == a.max_model_len:  # a longer max_model_len fits fewer at once
            assert b.concurrency_at_max_len >= a.concurrency_at_max_len


REFUSALS = [
    (LLAMA2, 24, {"max_model_len": 10000}),
    (LLAMA2, 24, {"num_kv_blocks": 100_000}),
    (LLAMA2, 24, {"quantization": "none", "max_num_batched_tokens": 1_000_000}),
    (LLAMA2, 14, {"quantization": "none"}),
    (LLAMA3, 24, {"quantization": "none", "gpu_memory_utilization": 0.65}),
    (LLAMA3, 4, {}),
    (LLAMA3, 80, {"max_model_len": 8192, "num_kv_blocks": 100}),
]


@pytest.mark.parametrize(("model", "gib", "pins"), REFUSALS)
def test_every_refusal_names_one_number_and_the_suggestion_fits(model, gib, pins):
    device, req = gpu(gib), PlanRequest(**pins)
    with pytest.raises(PlanError) as info:
        plan(model, device, req)
    err, message = info.value, str(info.value)
    assert err.value is not None
    if err.setting == "memory_gib":
        assert message.endswith(f"use a device with at least {err.value} GiB")
        plan(model, replace(device, total_bytes=err.value * GIB), req)
        return
    assert message.endswith(f"set {err.setting} to {err.value}")
    assert message.count(" set ") == 1  # never two suggestions
    plan(model, device, replace(req, **{err.setting: err.value}))  # the suggestion fits


def test_pinned_sequences_past_the_pool_are_served_with_preemption():
    """More pinned sequences than the pool holds at max_model_len is not refused: requests are
    rarely that long, and the scheduler preempts when the pool runs out. The reason says so."""
    pins = {"quantization": "none", "max_num_seqs": 64, "max_model_len": 4096}
    p = plan(LLAMA2, gpu(24), PlanRequest(**pins))
    held = p.num_kv_blocks // (4096 // p.block_size)
    assert p.max_num_seqs == 64 and held < 64 and p.concurrency_at_max_len == held
    assert f"the pool holds {held} sequences of max_model_len at once" in p.reasons["max_num_seqs"]


def test_refusal_prefers_the_setting_at_fault():
    with pytest.raises(PlanError) as info:
        plan(LLAMA2, gpu(24), PlanRequest(max_model_len=10000, max_num_seqs=4))
    assert info.value.setting == "max_model_len" and info.value.value == 4096


@settings(max_examples=80, deadline=None)
@given(
    model=st.sampled_from([LLAMA2, LLAMA3, QWEN3]),
    gib=st.floats(1, 200),
    pins=st.fixed_dictionaries(
        {},
        optional={
            "quantization": st.sampled_from(WEIGHT_FORMATS),
            "max_num_seqs": st.integers(1, 300),
            "max_model_len": st.integers(1, 40000),
            "num_kv_blocks": st.integers(1, 100_000),
            "max_num_batched_tokens": st.integers(1, 100_000),
            "gpu_memory_utilization": st.floats(0.1, 1.0),
            "dtype": st.sampled_from(["bfloat16", "float16"]),
        },
    ),
    bf16=st.booleans(),
)
def test_any_refusal_suggests_one_change_that_fits_or_moves_on(model, gib, pins, bf16):
    device, req = gpu(gib, bf16_supported=bf16), PlanRequest(**pins)
    try:
        plan(model, device, req)
        return
    except PlanError as exc:
        err = exc
    assert err.value is not None and str(err).count(": set ") + str(err).count(": use ") == 1
    if err.setting == "memory_gib":
        device = replace(device, total_bytes=err.value * GIB)
    else:
        req = replace(req, **{err.setting: err.value})
    try:
        plan(model, device, req)
    except PlanError as again:  # two independent problems: the next run names the other one
        assert again.setting != err.setting, (str(err), str(again))


def test_overheads_are_sized_for_the_chosen_batch_and_the_rest_goes_to_kv():
    """On a 24 GiB card the planner picks far fewer than the class's 256 sequences; the
    activation peak (sampling rows), the allocator cache and the graph pool are then sized for
    about its choice (between it and the next multiple of 8), and what that frees goes to the
    KV cache: here a 16-bit cache instead of the int8 one that overheads sized for 256
    sequences leave room for."""
    from engine.planner.formulas import activation_bytes, allocator_bytes

    m, dev = preset("llama-3-8b"), gpu(24)
    p, at_cap = plan(m, dev), plan(m, dev, PlanRequest(max_num_seqs=dev.max_num_seqs))
    seqs, tokens = p.max_num_seqs, p.max_num_batched_tokens
    assert seqs < dev.max_num_seqs
    for item, formula in (
        ("activation_bytes", activation_bytes),
        ("allocator_bytes", allocator_bytes),
    ):
        lo, hi = formula(m, tokens, seqs, 2), formula(m, tokens, seqs + 8, 2)
        assert lo <= getattr(p, item) < hi < getattr(at_cap, item), item
    assert p.graph_pool_bytes < at_cap.graph_pool_bytes
    assert (at_cap.kv_cache_dtype, p.kv_cache_dtype) == ("int8", "bfloat16") and p.target_met
    pinned = plan(m, dev, PlanRequest(max_num_seqs=seqs))  # overheads sized for exactly seqs
    assert pinned.kv_cache_dtype == "bfloat16" and pinned.num_kv_blocks >= p.num_kv_blocks


def test_plan_settings_name_a_cpu_plans_memory_share_without_a_gpu():
    cpu = Device(kind="cpu", name="host", total_bytes=16 * GIB, utilization=0.5, max_kv_bytes=GIB)
    on_cpu = {name: why for name, _, why in plan_settings(plan(QWEN3, cpu).to_dict())}
    assert "gpu_memory_utilization" not in on_cpu
    assert on_cpu["memory_utilization"] == "the CPU profile's share of the available RAM"
    assert not any("gpu" in why.lower() for why in on_cpu.values())
    on_gpu = {name: why for name, _, why in plan_settings(plan(QWEN3, gpu(24)).to_dict())}
    assert on_gpu["gpu_memory_utilization"] == "class default"
    assert list(on_gpu) == list(plan(QWEN3, gpu(24)).engine_kwargs())
