"""The planner's mixture-of-experts arithmetic on Qwen3-30B-A3B's shape: memory counts every
expert, the speed floor reads only the experts a decode batch can route to, and the activation
and graph-pool formulas follow the routed rows (moe_intermediate_size), not intermediate_size."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.memory.bandwidth import BandwidthMeter
from engine.models.model_config import ModelConfig
from engine.planner import GIB, Device, PlanRequest, plan
from engine.planner.formulas import (
    activation_bytes,
    allocator_bytes,
    decode_weight_bytes,
    expert_bytes,
    graph_pool_bytes,
    weight_bytes,
)

PRESETS = Path(__file__).resolve().parent.parent / "profiles" / "models"
QWEN3_MOE = ModelConfig.from_dict(json.loads((PRESETS / "qwen3-30b-a3b.json").read_text()))
H, MI, E, K, LAYERS = 2048, 768, 128, 8, 48
EXPERT = 3 * H * MI  # one expert's gate, up and down weights


def test_the_preset_counts_30b_total_and_3b_active():
    m = QWEN3_MOE
    assert (m.num_experts, m.num_experts_per_tok, m.norm_topk_prob) == (E, K, True)
    assert m.dense_layers == () and all(m.is_moe_layer(i) for i in range(LAYERS))
    # the model card: 30.5 B parameters in total, 3.3 B activated
    assert 30.4e9 < m.num_params < 30.6e9 and 3.3e9 < m.num_active_params < 3.4e9
    assert m.num_params - m.num_active_params == LAYERS * (E - K) * EXPERT


def test_memory_counts_every_expert_in_its_format():
    m = QWEN3_MOE
    experts = LAYERS * E * EXPERT
    rows = LAYERS * E * (2 * MI + H)  # one fp32 scale per row (int8), per 64 weights (int4)
    assert expert_bytes(m, "none", 2) == experts * 2
    assert expert_bytes(m, "int8", 2) == experts + 4 * rows
    assert expert_bytes(m, "int4", 2, 64) == experts // 2 + 4 * experts // 64
    assert weight_bytes(m, "none", 2, False) == m.num_params * 2
    for fmt in ("int8", "int4"):  # the rest: attention quantized, embeddings 16-bit
        rest = weight_bytes(m, fmt, 2, False) - expert_bytes(m, fmt, 2)
        assert 2 * 151936 * H * 2 < rest < (m.num_params - experts) * 2
    # at 4 bits Qwen3-30B-A3B's weights fit a 24 GB card
    assert weight_bytes(m, "int4", 2, False) < 18 * GIB


@pytest.mark.parametrize(
    "num_seqs, experts_read", [(1, K), (2, 2 * K), (15, 15 * K), (16, E), (256, E)]
)
def test_a_decode_step_reads_the_experts_its_batch_can_route_to(num_seqs, experts_read):
    m = QWEN3_MOE
    weights, experts = weight_bytes(m, "none", 2, False), expert_bytes(m, "none", 2)
    read = decode_weight_bytes(weights, experts, E, K, num_seqs)
    assert read == weights - LAYERS * (E - experts_read) * EXPERT * 2
    if num_seqs == 1:
        assert read == m.num_active_params * 2  # batch 1 reads the active parameters
    assert decode_weight_bytes(weights, 0, 0, 0, num_seqs) == weights  # a dense model


def test_the_plan_carries_the_counts_and_the_decode_bytes():
    dev = Device(kind="cuda", name="synthetic 141 GiB", total_bytes=141 * GIB, bandwidth_gbs=4800)
    p = plan(QWEN3_MOE, dev, PlanRequest())
    assert (p.num_params, p.num_active_params) == (
        QWEN3_MOE.num_params,
        QWEN3_MOE.num_active_params,
    )
    assert p.decode_weight_bytes(1) == QWEN3_MOE.num_active_params * 2
    assert p.decode_weight_bytes(p.max_num_seqs) == p.weight_bytes
    meter = BandwidthMeter(
        p.weight_bytes,
        p.kv_bytes_per_token,
        4800,
        "nominal",
        step_weight_bytes=p.decode_weight_bytes,
    )
    assert meter.read_bytes([10]) == p.decode_weight_bytes(1) + 10 * p.kv_bytes_per_token
    assert meter.read_bytes([10] * 16) == p.weight_bytes + 160 * p.kv_bytes_per_token


def test_activation_formulas_follow_the_routed_rows_not_intermediate_size():
    m = QWEN3_MOE
    # every layer has experts: the config's intermediate_size (6144) sizes nothing
    bigger = replace(m, intermediate_size=4 * m.intermediate_size)
    for f in (
        lambda c: activation_bytes(c, 2048, 256, 2),
        lambda c: activation_bytes(c, 2048, 256, 2, "int4"),
        lambda c: allocator_bytes(c, 2048, 256, 2),
        lambda c: graph_pool_bytes(c, 256, 2),
    ):
        assert f(bigger) == f(m)
    # the routed rows do: k rows per token of 3 x moe_intermediate_size + hidden
    wider = replace(m, moe_intermediate_size=2 * MI)
    grown = activation_bytes(wider, 2048, 256, 2) - activation_bytes(m, 2048, 256, 2)
    assert grown == 2048 * 2 * K * 3 * MI
    # one dense layer brings its MLP back into the count
    with_dense = replace(m, dense_layers=(0,), intermediate_size=40 * MI)
    assert activation_bytes(with_dense, 2048, 256, 2) > activation_bytes(m, 2048, 256, 2)
