"""The planner with linear-attention layers (Qwen3.5's shape): the KV formula counts the full
layers only, a state pool of one slot per max_num_seqs sequence is reserved before the KV pool,
the speed floor adds each sequence's state read and written back, and pins the state pool cannot
hold are refused with the one number to change."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.memory.bandwidth import BandwidthMeter
from engine.models.linear_attention import LINEAR, LinearAttention
from engine.models.model_config import FULL
from engine.models.param_counts import linear_attention_params
from engine.planner import GIB, PlanError, PlanRequest, plan
from engine.planner.formulas import state_bytes_per_sequence
from tests.test_planner import LLAMA3, gpu

MIB = 1024**2


def hybrid(num_layers: int = 64, interval: int = 4, **shape):
    """Qwen3.5-27B's text shape on a Llama config: three linear layers to each full one."""
    types = tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers))
    fields = dict(
        vocab_size=248320,
        hidden_size=5120,
        intermediate_size=17408,
        num_layers=num_layers,
        num_heads=24,
        num_kv_heads=4,
        head_dim=256,
        layer_types=types,
        linear_attention=LinearAttention(16, 48, 128, 128, 4),
        attn_output_gate=True,
        qk_norm=True,
        partial_rotary_factor=0.25,
        max_position_embeddings=262144,
        rope_scaling=None,
    )
    return replace(LLAMA3, **{**fields, **shape})


Q35 = hybrid()


def test_kv_counts_the_full_layers_and_the_state_the_linear_ones():
    # 16 full layers x 2 (K and V) x 4 KV heads x 256 x 2 B
    assert Q35.kv_cache_bytes_per_token("bfloat16") == 16 * 2 * 4 * 256 * 2 == 64 * 1024
    # 48 linear layers x (48 value heads x 128 x 128 fp32 + (2 x 16 x 128 + 48 x 128) x 3 bf16)
    per_layer = 48 * 128 * 128 * 4 + (2 * 16 * 128 + 48 * 128) * 3 * 2
    assert state_bytes_per_sequence(Q35, 2) == 48 * per_layer == 153_944_064
    assert state_bytes_per_sequence(LLAMA3, 2) == 0


def test_param_counts_follow_the_linear_and_gated_layers():
    h = 5120
    qkvz_ba_out = h * (2 * 16 * 128 + 48 * 128) + h * 48 * 128 + 2 * h * 48 + 48 * 128 * h
    assert linear_attention_params(Q35)[0] == qkvz_ba_out
    full_attn = h * (2 * 24 * 256 + 2 * 4 * 256) + 24 * 256 * h  # q_proj twice as wide: the gate
    mlp = 3 * h * 17408
    linear = 48 * qkvz_ba_out + 16 * full_attn + 64 * mlp
    assert Q35.param_counts().linear == linear
    assert 26.5e9 < Q35.num_params < 27.5e9  # "27B"; the vision tower is not counted


def test_plan_reserves_a_state_slot_per_sequence_before_the_kv_pool():
    p = plan(Q35, gpu(80))
    assert p.state_bytes_per_sequence == state_bytes_per_sequence(Q35, 2)
    assert p.state_pool_bytes == p.max_num_seqs * p.state_bytes_per_sequence > 0
    assert p.kv_bytes_per_token == 64 * 1024
    parts = p.weight_bytes + p.activation_bytes + p.graph_pool_bytes + p.cuda_context_bytes
    parts += p.allocator_bytes + p.margin_bytes
    assert parts + p.kv_pool_bytes + p.state_pool_bytes <= p.budget_bytes
    # what is left holds less than a block, plus the slots max_num_seqs rounded away
    left = p.budget_bytes - parts - p.kv_pool_bytes - p.state_pool_bytes
    assert left < p.block_size * p.kv_bytes_per_token + p.state_bytes_per_sequence
    assert "a state slot each" in p.reasons["max_num_seqs"]


def test_a_model_without_linear_layers_plans_no_state():
    p = plan(LLAMA3, gpu(80))
    assert p.state_bytes_per_sequence == p.state_pool_bytes == 0
    assert "state" not in p.reasons["max_num_seqs"]


def test_more_sequences_cost_state_memory_not_just_kv():
    few = plan(Q35, gpu(80), PlanRequest(max_num_seqs=8))
    many = plan(Q35, gpu(80), PlanRequest(max_num_seqs=48))
    extra_state = 40 * few.state_bytes_per_sequence
    assert many.state_pool_bytes - few.state_pool_bytes == extra_state
    assert many.kv_pool_bytes < few.kv_pool_bytes  # the state came out of the KV pool


def test_pinned_sequences_whose_state_cannot_fit_are_refused_naming_max_num_seqs():
    device, req = gpu(80), PlanRequest(max_num_seqs=256, quantization="none")
    with pytest.raises(PlanError) as info:
        plan(Q35, device, req)
    err = info.value
    assert err.setting == "max_num_seqs" and "state pool of 256 slots" in str(err)
    fits = plan(Q35, device, replace(req, max_num_seqs=err.value))
    assert fits.state_pool_bytes == err.value * fits.state_bytes_per_sequence


@settings(max_examples=30, deadline=None)
@given(small=st.floats(30, 160), extra=st.floats(0.5, 60))
def test_more_memory_never_plans_fewer_sequences_or_less_kv_and_state(small, extra):
    a, b = plan(Q35, gpu(small)), plan(Q35, gpu(small + extra))
    if (a.quantization, a.kv_cache_dtype) != (b.quantization, b.kv_cache_dtype):
        return  # a better format took the memory
    assert b.max_num_seqs >= a.max_num_seqs
    assert b.kv_pool_bytes + b.state_pool_bytes >= a.kv_pool_bytes + a.state_pool_bytes


def test_decode_floor_reads_and_writes_each_sequences_state():
    p = plan(Q35, gpu(80))
    contexts = [1000, 32000]
    kv = sum(contexts) * p.kv_bytes_per_token
    state = 2 * 2 * p.state_bytes_per_sequence  # read and written back, two sequences
    assert p.decode_bytes(contexts) == p.weight_bytes + kv + state
    assert BandwidthMeter.for_plan(p).read_bytes(contexts) == p.decode_bytes(contexts)
    dense = plan(LLAMA3, gpu(80))
    assert BandwidthMeter.for_plan(dense).read_bytes(contexts) == dense.decode_bytes(contexts)
    assert dense.decode_bytes(contexts) == dense.weight_bytes + sum(contexts) * (128 * 1024)


def test_at_32k_a_hybrid_sequence_costs_a_quarter_of_the_kv_plus_its_state():
    per_seq = 32768 * Q35.kv_cache_bytes_per_token("bfloat16") + state_bytes_per_sequence(Q35, 2)
    assert per_seq == 2 * GIB + 153_944_064
    assert per_seq < 3 * GIB
    assert 146 * MIB < state_bytes_per_sequence(Q35, 2) < 147 * MIB


def test_profile_shows_kv_per_token_state_per_sequence_and_both_pools(capsys):
    from appliance.probe import CpuProbe, Probe
    from appliance.profile_report import print_tables

    device = gpu(80, bandwidth_gbs=4800.0)
    p = plan(Q35, device)
    print_tables("qwen3.5-27b", Q35, Probe(CpuProbe()), device, p, {}, [])
    out = capsys.readouterr().out
    assert "2 x 16 layers holding K/V x 4 KV heads x 256 x 2 B (bfloat16)" in out
    assert f"{p.state_bytes_per_sequence:,} B" in out
    assert "48 linear layers x (48 x 128 x 128 x 4 B recurrent + 10240 x 3 x 2 B conv)" in out
    assert f"{p.max_num_seqs} slots x {p.state_bytes_per_sequence:,} B" in out
    assert "KV + state read and written" in out
    print_tables("llama-3-8b", LLAMA3, Probe(CpuProbe()), device, plan(LLAMA3, device), {}, [])
    dense = capsys.readouterr().out
    assert "2 x 32 layers x 8 KV heads x 128 x 2 B (bfloat16)" in dense
    assert "state" not in dense


def test_the_memory_check_predicts_and_lists_the_state_pool():
    from engine.memory.memory_check import MemoryItems, MemoryReport

    p = plan(Q35, gpu(80))
    items = MemoryItems.from_plan(p)
    assert items.state_pool == p.state_pool_bytes
    parts = p.weight_bytes + p.activation_bytes + p.graph_pool_bytes + p.kv_pool_bytes
    assert items.total == parts + p.allocator_bytes + p.cuda_context_bytes + p.state_pool_bytes
    report = MemoryReport(items, items, items.total, items.total, p.num_kv_blocks, 0, 1)
    assert "state_pool" in [row[0] for row in report.rows()]
    dense = MemoryItems.from_plan(plan(LLAMA3, gpu(80)))
    report = MemoryReport(dense, dense, dense.total, dense.total, 1, 0, 1)
    assert "state_pool" not in [row[0] for row in report.rows()]


def test_prefix_caching_is_turned_off_for_a_hybrid_model_with_one_log_line(caplog):
    from engine.config import EngineConfig
    from engine.startup.planned_config import prefix_caching_for

    config = EngineConfig.from_kwargs(dtype="bfloat16")
    with caplog.at_level("INFO", logger="engine.startup.planned_config"):
        off = prefix_caching_for(Q35, config)
        assert prefix_caching_for(LLAMA3, config).prefix_caching  # a dense model keeps it
        assert not prefix_caching_for(Q35, replace(config, prefix_caching=False)).prefix_caching
    assert config.prefix_caching and not off.prefix_caching
    lines = [r.getMessage() for r in caplog.records if "prefix caching" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("prefix caching off: the model's 48 linear-attention layers")
    assert f"{state_bytes_per_sequence(Q35, 2)} bytes" in lines[0]
