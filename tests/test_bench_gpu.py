"""The GPU benchmark's CPU-checkable parts: floor arithmetic, targets, presets, a tiny run."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from benchmarks import bench_gpu, presets
from benchmarks.floor import (
    Hardware,
    ModelShape,
    batch1_decode_floor_tok_s,
    decode_step_floor_s,
    kv_bytes_per_token,
    throughput_floor,
    ttft_floor_s,
    verdict,
)
from engine.models.model_config import ModelConfig

H200 = Hardware(bandwidth=4.28e12, matmul_flops=784e12)  # measured on the H200
PRESETS = ["llama-3-8b", "qwen3-0.6b", "qwen2.5-7b", "mistral-7b", "llama-2-7b", "qwen3-30b-a3b"]


def shape(name: str) -> ModelShape:
    return ModelShape.from_model_config(ModelConfig.from_dict(presets.load_preset(name)))


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_a_config_the_engine_accepts(name, tmp_path):
    folder = presets.materialise_preset(name, tmp_path)
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    cfg = ModelConfig.from_folder(folder)
    assert cfg.vocab_size > 0 and cfg.num_layers > 0


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="llama-3-8b"):
        presets.load_preset("llama-9-400b")


def test_presets_have_the_public_shapes():
    llama3 = ModelConfig.from_dict(presets.load_preset("llama-3-8b"))
    assert (llama3.num_layers, llama3.num_kv_heads, llama3.head_dim) == (32, 8, 128)
    assert llama3.num_params == pytest.approx(8.03e9, rel=0.005)
    qwen = ModelConfig.from_dict(presets.load_preset("qwen3-0.6b"))
    assert qwen.tie_word_embeddings and qwen.qk_norm
    assert qwen.num_params == pytest.approx(0.596e9, rel=0.01)


def test_gemma_3_12b_preset_has_the_public_shape():
    gemma = ModelConfig.from_dict(presets.load_preset("gemma-3-12b"))
    assert (gemma.num_layers, gemma.num_kv_heads, gemma.head_dim) == (48, 8, 256)
    assert [gemma.layer_type(i) for i in range(12)].count("full_attention") == 2
    assert gemma.layer_attention(5).rope_scaling["factor"] == 8.0  # linear, the global layers
    assert gemma.layer_attention(0).rope_scaling is None
    counts = gemma.param_counts()
    # Gemma 3 technical report, table 1: 1,012M embedding and 10,759M other parameters
    assert counts.total - counts.embed == pytest.approx(10_759e6, rel=0.01)
    assert counts.embed == pytest.approx(1_012e6, rel=0.01)


def test_gemma_4_presets_count_the_published_parameters():
    """Gemma 4's model card (google/gemma-4-*): 31B dense 30.7 B; 26B-A4B 25.2 B total, 3.8 B
    active; E2B 2.3 B and E4B 4.5 B "effective" (without the per-layer-input table). The text
    models' counts: the vision and audio encoders are not part of them."""
    dense = ModelConfig.from_dict(presets.load_preset("gemma-4-31b"))
    assert dense.num_params == pytest.approx(30.7e9, rel=0.005)
    assert [dense.layer_attention(i).head_dim for i in (4, 5)] == [256, 512]
    assert [dense.layer_attention(i).num_kv_heads for i in (4, 5)] == [16, 4]
    moe = ModelConfig.from_dict(presets.load_preset("gemma-4-26b-a4b"))
    assert moe.num_params == pytest.approx(25.2e9, rel=0.005)
    assert moe.num_active_params == pytest.approx(3.8e9, rel=0.01)
    assert all(moe.is_moe_layer(i) for i in range(30)) and moe.moe_beside_mlp
    for name, effective, rel in (("gemma-4-e2b", 2.3e9, 0.01), ("gemma-4-e4b", 4.5e9, 0.035)):
        small = ModelConfig.from_dict(presets.load_preset(name))
        table = small.vocab_size_per_layer_input * small.hidden_size_per_layer_input
        table *= small.num_layers
        assert small.num_params - table == pytest.approx(effective, rel=rel), name
    # the floor's KV bytes per token are the engine's: full layers' own head dim and KV heads
    assert shape("gemma-4-31b").kv_bytes_per_token == 2 * 2 * (50 * 16 * 256 + 10 * 4 * 512)


def test_moe_floors_read_the_active_weights_at_batch_1_and_the_routed_experts_beyond():
    moe = shape("qwen3-30b-a3b")
    assert moe.num_params == pytest.approx(30.53e9, rel=0.001)
    assert moe.active_params == pytest.approx(3.35e9, rel=0.001)
    expert = 3 * 2048 * 768 * 2  # one expert's bytes in one layer, bf16
    assert moe.decode_weight_bytes(1) == moe.active_params * 2
    assert moe.decode_weight_bytes(4) == moe.active_params * 2 + 48 * 24 * expert
    assert moe.decode_weight_bytes(16) == moe.decode_weight_bytes(256) == moe.weight_bytes
    # batch 1 decodes like a 3.35 B model: 4.28 TB/s / (6.7 GB + 640 x 96 KiB) ~ 630 tok/s
    floor = batch1_decode_floor_tok_s(moe, H200, 128, 512)
    kv = 2 * 48 * 4 * 128 * 2
    assert floor == pytest.approx(H200.bandwidth / (moe.active_params * 2 + 384 * kv))
    assert 600 < floor < 650
    # a step of 256 sequences reads every expert; its FLOPs are the active parameters'
    assert decode_step_floor_s(moe, H200, 256, 0) == pytest.approx(
        moe.weight_bytes / H200.bandwidth
    )
    assert ttft_floor_s(moe, H200, 1024) == pytest.approx(
        ttft_floor_s(replace(moe, num_params=moe.active_params, expert_params=0), H200, 1024)
    )
    dense = shape("llama-3-8b")  # a dense model reads all of its weights at any batch
    assert (
        dense.decode_weight_bytes(1) == dense.weight_bytes and dense.flop_params == dense.num_params
    )


def test_kv_bytes_per_token_uses_kv_heads():
    # the KV-cache formula: Llama-3-8B 128 KiB/token (GQA), Llama-2-7B 512 KiB (MHA)
    assert shape("llama-3-8b").kv_bytes_per_token == 131072
    assert shape("llama-2-7b").kv_bytes_per_token == 512 * 1024
    assert kv_bytes_per_token(28, 8, 128, 2) == shape("qwen3-0.6b").kv_bytes_per_token


def test_batch1_decode_floor_matches_design():
    # Workload B: ~266 tok/s on the H200 (16 GB of weights read per token).
    assert batch1_decode_floor_tok_s(shape("llama-3-8b"), H200, 128, 512) == pytest.approx(
        266, abs=1.5
    )


def test_ttft_floor_matches_design():
    llama3 = shape("llama-3-8b")
    assert ttft_floor_s(llama3, H200, 1024) * 1e3 == pytest.approx(21, abs=0.5)
    assert ttft_floor_s(llama3, H200, 4096) * 1e3 == pytest.approx(90, abs=1.0)


def test_throughput_floor_of_workload_a_matches_design():
    rng = random.Random(0)
    prompts = [rng.randint(100, 1024) for _ in range(256)]
    floor = throughput_floor(shape("llama-3-8b"), H200, prompts, [512] * 256)
    assert floor.num_decode_steps == 511
    assert floor.output_tokens == 256 * 512
    assert floor.tok_s == pytest.approx(16_000, rel=0.04)  # workload A's floor: ~16k
    assert 2.5 < floor.prefill_s < 3.5  # ~144k prompt tokens x 16 GFLOP / 784 TFLOP/s


def test_throughput_floor_sums_the_decode_steps_it_simulates():
    s = shape("qwen3-0.6b")
    # Prompts 10 and 20, outputs 3 and 2: the first token comes from prefill, so decode step 1
    # runs both (contexts 11 + 21) and step 2 only the first (12).
    floor = throughput_floor(s, H200, [10, 20], [3, 2])
    expected = decode_step_floor_s(s, H200, 2, 32) + decode_step_floor_s(s, H200, 1, 12)
    assert floor.decode_s == pytest.approx(expected)
    assert floor.num_decode_steps == 2 and floor.output_tokens == 5


def test_decode_step_is_memory_bound_and_grows_with_context():
    s = shape("llama-3-8b")
    t0 = decode_step_floor_s(s, H200, 1, 0)
    assert t0 == pytest.approx(s.weight_bytes / H200.bandwidth)
    t1 = decode_step_floor_s(s, H200, 1, 1_000_000)
    assert t1 - t0 == pytest.approx(1_000_000 * 131072 / H200.bandwidth)


def test_throughput_floor_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        throughput_floor(shape("qwen3-0.6b"), H200, [10, 20], [5])


@pytest.mark.parametrize(
    ("workload", "achieved", "floor", "result"),
    [
        ("A", 12_000, 16_000, "pass"),
        ("A", 11_999, 16_000, "FAIL"),
        ("B", 226, 266, "pass"),
        ("B", 225, 266, "FAIL"),
        ("C-1024", 27.0, 21.0, "pass"),
        ("C-4096", 118.0, 90.0, "FAIL"),
        ("D", 10_000, 35_000, "pass"),
        ("D", None, 35_000, "n/a"),
        ("G3-B", 145, 181, "pass"),
        ("G3-B", 144, 181, "FAIL"),
        ("G3-A", 4_620, 7_700, "pass"),
        ("G3-A", 4_619, 7_700, "FAIL"),
        ("Q3MOE-B", 480, 600, "pass"),
        ("Q3MOE-B", 479, 600, "FAIL"),
        ("Q3MOE-A", 6_000, 10_000, "pass"),
        ("Q3MOE-A", 5_999, 10_000, "FAIL"),
        ("G4-B", 56, 69, "pass"),
        ("G4-B", 55, 69, "FAIL"),
        ("G4MOE-A", 6_000, 10_000, "pass"),
        ("G4MOE-A", 5_999, 10_000, "FAIL"),
    ],
)
def test_verdict_against_design_targets(workload, achieved, floor, result):
    assert verdict(workload, achieved, floor)[1] == result


def test_random_prompts_are_seeded_in_range_and_not_zeros():
    a = presets.random_prompts(8, 100, 1024, 1000, seed=3)
    assert a == presets.random_prompts(8, 100, 1024, 1000, seed=3)
    assert all(100 <= len(p) <= 1024 and min(p) >= 1 and max(p) < 1000 for p in a)
    assert len({len(p) for p in a}) > 1


def test_tiny_run_end_to_end_on_cpu(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: threads only add overhead on a busy CI box
    try:
        rc = bench_gpu.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    results = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert rc == 0
    assert [r["workload"] for r in results["rows"]] == ["A", "B", "C-32", "C-64", "D"]
    for row in results["rows"]:
        assert row["achieved"] > 0 and row["floor"] > 0, row
    a = results["rows"][0]
    assert a["detail"]["output_tokens"] == 4 * 8  # ignore_eos: every request ran to length
    assert results["hardware"]["bandwidth"] > 0
    assert results["engines"]["llama-3-8b"]["config"]["load_format"] == "random"
    for c in results["rows"][2:4]:  # one profiled request per C length (kernels on a GPU)
        assert c["detail"]["profile"]["wall_ms"] > 0


def test_tiny_moe_family_run_on_cpu(tmp_path):
    """--workloads Q3MOE --tiny: Qwen3-30B-A3B's architecture with 8 tiny experts, top-2; the
    batch-1 floor reads the active weights only."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["--device", "cpu", "--tiny", "--workloads", "q3moe", "--out", str(tmp_path)]
        rc = bench_gpu.main(argv)
    finally:
        torch.set_num_threads(threads)
    results = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert rc == 0
    assert [r["workload"] for r in results["rows"]] == ["Q3MOE-B", "Q3MOE-A"]
    for row in results["rows"]:
        assert row["achieved"] > 0 and row["floor"] > 0 and row["verdict"] == "n/a (reduced)"
    engine = results["engines"]["qwen3-30b-a3b"]
    cfg = ModelConfig.from_dict(presets.load_preset("qwen3-30b-a3b", tiny=True))
    assert (cfg.num_experts, cfg.num_experts_per_tok) == (8, 2) and engine["num_params"] > 0
    # fp32 weights; batch 1 reads 2 of each layer's 8 experts
    assert results["rows"][0]["detail"]["floor_weight_bytes"] == cfg.num_active_params * 4


@pytest.mark.parametrize(
    "argv",
    [
        ["--seqs", "3", "--steps", "2", "--phases"],
        ["--seqs", "1", "--prefill", "40", "--steps", "2"],
    ],
)
def test_bench_host_runs_with_the_stub_model(argv, capsys):
    """benchmarks/bench_host.py swaps the model for a stub: it must keep up with the runner's
    calls (a signature change there broke it once)."""
    from benchmarks import bench_host

    bench_host.main(argv)
    assert "host cost" in capsys.readouterr().out


def test_tiny_family_rows_on_cpu(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["--device", "cpu", "--tiny", "--workloads", "G3", "--out", str(tmp_path)]
        rc = bench_gpu.main(argv)
    finally:
        torch.set_num_threads(threads)
    rows = json.loads((tmp_path / "bench_gpu.json").read_text())["rows"]
    assert rc == 0 and [r["workload"] for r in rows] == ["G3-B", "G3-A"]
    assert all(r["detail"]["model"] == "gemma-3-12b" and r["achieved"] > 0 for r in rows)


def test_tiny_gemma_4_family_rows_on_cpu(tmp_path):
    """--workloads G4,G4MOE --tiny: Gemma 4's dense and MoE architectures, two layers (the
    preset's layer_types dropped: one sliding, one full), 8 tiny experts, top-2."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["--device", "cpu", "--tiny", "--workloads", "G4,G4MOE", "--out", str(tmp_path)]
        rc = bench_gpu.main(argv)
    finally:
        torch.set_num_threads(threads)
    results = json.loads((tmp_path / "bench_gpu.json").read_text())
    rows = results["rows"]
    assert rc == 0 and [r["workload"] for r in rows] == ["G4-B", "G4-A", "G4MOE-B", "G4MOE-A"]
    assert all(r["achieved"] > 0 and r["floor"] > 0 for r in rows), rows
    cfg = ModelConfig.from_dict(presets.load_preset("gemma-4-26b-a4b", tiny=True))
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.layer_types) == (
        8,
        2,
        ("sliding_attention", "full_attention"),
    )
    assert rows[2]["detail"]["floor_weight_bytes"] == cfg.num_active_params * 4  # fp32
