"""The hybrid (Qwen3.5) side of the benchmarks: the public shapes of the Qwen3.5 presets and the
dense Qwen3-32B, the floors that count the full layers' K/V and each sequence's state read and
written back, the Q35 family rows, and the memory-per-sequence comparison at 32k."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_gpu, bench_state_memory, presets
from benchmarks.floor import (
    Hardware,
    ModelShape,
    batch1_decode_floor_tok_s,
    decode_step_floor_s,
    verdict,
)
from engine.models.model_config import ModelConfig

H200 = Hardware(bandwidth=4.28e12, matmul_flops=784e12)  # measured on the H200
GIB = 1024**3
STATE_27B = 48 * (48 * 128 * 128 * 4 + (2 * 16 * 128 + 48 * 128) * 3 * 2)  # bf16 conv state


def config(name: str, tiny: bool = False) -> ModelConfig:
    return ModelConfig.from_dict(presets.load_preset(name, tiny=tiny))


@pytest.mark.parametrize("name", ["qwen3.5-27b", "qwen3-32b"])
def test_the_presets_are_configs_the_engine_accepts(name, tmp_path):
    folder = presets.materialise_preset(name, tmp_path)
    assert ModelConfig.from_folder(folder).num_layers == 64


def test_qwen3_5_27b_preset_has_the_public_shape():
    cfg = config("qwen3.5-27b")
    assert len(cfg.linear_layer_ids()) == 48 and cfg.attention_layer_ids()[:2] == [3, 7]
    att = cfg.layer_attention(3)
    assert (cfg.num_heads, att.num_kv_heads, att.head_dim) == (24, 4, 256)
    assert att.partial_rotary_factor == 0.25 and att.rope_theta == 1e7 and cfg.attn_output_gate
    assert cfg.kv_cache_bytes_per_token("bfloat16") == 64 * 1024
    assert cfg.state_bytes_per_sequence(4, 2) == STATE_27B
    # the text model: 27.78 B in the checkpoint's shards counts the vision tower and MTP head too
    assert cfg.num_params == pytest.approx(26.90e9, rel=0.002)


def test_qwen3_5_35b_a3b_preset_has_the_public_shape():
    cfg = config("qwen3.5-35b-a3b")
    assert len(cfg.linear_layer_ids()) == 30 and len(cfg.attention_layer_ids()) == 10
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (256, 8, 512)
    assert cfg.shared_expert_intermediate_size == 512 and cfg.norm_topk_prob
    assert cfg.kv_cache_bytes_per_token("bfloat16") == 10 * 2 * 2 * 256 * 2  # 20 KiB
    # 30 x (32 x 128 x 128 x 4 B + (2 x 16 x 128 + 32 x 128) x 3 x 2 B)
    assert cfg.state_bytes_per_sequence(4, 2) == 30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)
    # "35B-A3B": the text model's total and active parameters
    assert cfg.num_params == pytest.approx(34.66e9, rel=0.002)
    assert cfg.num_active_params == pytest.approx(3.45e9, rel=0.005)


def test_qwen3_32b_preset_has_the_public_shape():
    cfg = config("qwen3-32b")
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (64, 64, 8, 128)
    assert cfg.kv_cache_bytes_per_token("bfloat16") == 256 * 1024
    assert cfg.num_params == pytest.approx(32.76e9, rel=0.002)  # "32.8B"


def test_hybrid_floors_count_the_full_layers_kv_and_the_state_both_ways():
    shape = ModelShape.from_model_config(config("qwen3.5-27b"))
    assert (shape.attention_layers, shape.kv_bytes_per_token) == (16, 64 * 1024)
    assert shape.state_bytes_per_seq == STATE_27B and shape.state_traffic(3) == 6 * STATE_27B
    weights = shape.num_params * 2
    want = H200.bandwidth / (weights + (128 + 256) * 64 * 1024 + 2 * STATE_27B)
    assert batch1_decode_floor_tok_s(shape, H200, 128, 512) == pytest.approx(want)
    # a step of 256 sequences reads and writes 73 GiB of state, more than the 50 GiB of weights
    step = decode_step_floor_s(shape, H200, 256, 256 * 1024)
    assert step == pytest.approx((weights + 512 * STATE_27B + 256 * 1024 * 65536) / H200.bandwidth)
    dense = ModelShape.from_model_config(config("qwen3-32b"))
    assert dense.state_bytes_per_seq == 0 and dense.attention_layers == 64


def test_q35_family_rows_are_judged_against_their_floors():
    assert bench_gpu.FAMILIES["Q35"] == "qwen3.5-27b"
    assert verdict("Q35-B", 81, 100) == (">= 80% of floor", "pass")
    assert verdict("Q35-B", 79, 100)[1] == "FAIL"
    assert verdict("Q35-A", 61, 100) == (">= 60% of floor", "pass")


def test_tiny_qwen3_5_preset_keeps_three_linear_layers_to_one_full():
    cfg = config("qwen3.5-27b", tiny=True)
    assert [cfg.layer_type(i) for i in range(cfg.num_layers)] == ["linear_attention"] * 3 + [
        "full_attention"
    ]
    assert cfg.linear_attention.num_value_heads == 4 and cfg.hidden_size == 64


def test_tiny_q35_family_run_on_cpu(tmp_path):
    pytest.importorskip("engine.models.qwen3_5")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["--device", "cpu", "--tiny", "--workloads", "q35", "--out", str(tmp_path)]
        rc = bench_gpu.main(argv)
    finally:
        torch.set_num_threads(threads)
    rows = json.loads((tmp_path / "bench_gpu.json").read_text())["rows"]
    assert rc == 0 and [r["workload"] for r in rows] == ["Q35-B", "Q35-A"]
    assert all(r["achieved"] > 0 and r["floor"] > 0 for r in rows)


def test_memory_per_sequence_at_32k_planned():
    rows = bench_state_memory.compare(32768, "bfloat16", None)
    hybrid, dense = (r["planned"] for r in rows)
    assert hybrid == {
        "blocks": 2048,
        "kv_bytes": 2 * GIB,
        "state_bytes": STATE_27B,
        "total_bytes": 2 * GIB + STATE_27B,
    }
    assert dense["kv_bytes"] == dense["total_bytes"] == 8 * GIB and dense["state_bytes"] == 0
    assert hybrid["total_bytes"] / dense["total_bytes"] == pytest.approx(0.268, abs=0.001)


def test_memory_per_sequence_measured_from_the_engines_pools_on_the_cpu():
    pytest.importorskip("engine.memory.state_pool")
    device = torch.device("cpu")
    for name in bench_state_memory.MODELS:
        cfg = config(name)
        got = bench_state_memory.measured(cfg, 256, "bfloat16", device)
        want = bench_state_memory.planned(cfg, 256, "bfloat16")
        assert (got["kv_bytes"], got["state_bytes"]) == (want["kv_bytes"], want["state_bytes"])


def test_tiny_q35moe_family_run_on_cpu(tmp_path):
    """Qwen3.5-35B-A3B's architecture with 8 tiny experts, top-2, and a shared expert; the
    batch-1 floor reads the active weights and the state."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["--device", "cpu", "--tiny", "--workloads", "q35moe", "--out", str(tmp_path)]
        rc = bench_gpu.main(argv)
    finally:
        torch.set_num_threads(threads)
    rows = json.loads((tmp_path / "bench_gpu.json").read_text())["rows"]
    assert rc == 0 and [r["workload"] for r in rows] == ["Q35MOE-B", "Q35MOE-A"]
    cfg = config("qwen3.5-35b-a3b", tiny=True)
    assert (cfg.num_experts, cfg.shared_expert_intermediate_size) == (8, 32)
    assert rows[0]["detail"]["floor_weight_bytes"] == cfg.num_active_params * 4  # fp32


@pytest.mark.gpu
def test_memory_per_sequence_at_32k_measured_on_the_gpu():
    """The engine's pools for one 32k sequence, allocated on the GPU: what the allocator hands
    out equals the planner's figures (every tensor a multiple of the allocator's 512 B)."""
    rows = bench_state_memory.compare(32768, "bfloat16", torch.device("cuda"))
    for row in rows:
        planned, measured = row["planned"], row["measured"]
        assert measured["kv_allocated"] == measured["kv_bytes"] == planned["kv_bytes"]
        assert measured["state_allocated"] == measured["state_bytes"] == planned["state_bytes"]
    assert rows[0]["measured"]["total_bytes"] == 2 * GIB + STATE_27B
