"""The embedding benchmark on the CPU: its FLOPs arithmetic by hand, the Qwen3-Embedding-0.6B
shape's parameters, and tiny runs of the random-weight (floor only) and saved (with
transformers) paths."""

from __future__ import annotations

import re

import pytest

from benchmarks import bench_embed, embed_floor
from benchmarks.floor import ModelShape
from engine.models.model_config import ModelConfig
from engine.models.model_kind import ModelKind, model_kind

SHAPE = ModelShape(num_params=1000, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)


def test_flops_of_causal_inputs_by_hand():
    # per input: 2 x 1000 x 8 = 16000 dense; 4 x 2 layers x 4 heads x 16 x (8 x 9 / 2 = 36
    # causal pairs) = 18432 attention
    assert embed_floor.embed_flops(SHAPE, 3, 8, causal=True) == 3 * (16000 + 18432)


def test_flops_of_bidirectional_inputs_count_every_pair():
    # 4 x 2 x 4 x 16 x 64 pairs = 32768 attention
    assert embed_floor.embed_flops(SHAPE, 3, 8, causal=False) == 3 * (16000 + 32768)


def test_qwen3_embedding_shape_and_its_non_embedding_params():
    cfg = bench_embed.arch_config("qwen3-0.6b")
    dims = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads)
    assert dims == (1024, 28, 16)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size) == (8, 128, 3072)
    assert cfg.vocab_size == 151669 and cfg.tie_word_embeddings
    h, layers = 1024, 28
    attention = h * (16 * 128 + 2 * 8 * 128) + 16 * 128 * h  # q, k, v, o
    per_layer = attention + 3 * h * 3072 + 2 * h + 2 * 128  # MLP, two norms, q/k norms
    shape = embed_floor.model_shape(cfg)
    assert shape.num_params == layers * per_layer + h  # and the final norm
    assert (shape.num_layers, shape.num_heads, shape.head_dim) == (28, 16, 128)


def test_the_engine_reads_the_full_shape_from_config_json_alone(tmp_path):
    folder = tmp_path / "model"
    bench_embed.build("qwen3-0.6b", bench_embed.arch_config("qwen3-0.6b"), folder)
    assert sorted(p.name for p in folder.iterdir()) == ["1_Pooling", "config.json"]
    cfg = ModelConfig.from_folder(folder)
    assert cfg.num_params == 440_467_456 + 151669 * 1024  # tied: one embedding table
    assert model_kind(folder, is_encoder=False) == ModelKind("embed", "lasttoken")


def test_tiny_dims_replace_the_shape():
    cfg = bench_embed.arch_config("qwen3-0.6b", tiny=True)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (64, 2, 151669)


def _numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", line)]


def test_random_weight_shape_reports_engine_floor_and_ratio(capsys):
    bench_embed.main(["--arch", "qwen3-0.6b", "--tiny", "--num", "8", "--len", "16"])
    lines = capsys.readouterr().out.splitlines()
    engine = next(x for x in lines if x.startswith("engine LLM.embed"))
    floor = next(x for x in lines if x.startswith("prefill floor"))
    ratio = next(x for x in lines if x.startswith("ratio engine / prefill floor"))
    assert any(x.startswith("transformers: skipped") for x in lines)
    assert "[128 x 64] x [64 x 128] float32 GEMM" in floor  # 8 x 16 tokens, hidden, intermediate
    ours, floor_rate = _numbers(engine)[0], _numbers(floor)[-1]
    assert floor_rate > 0 and ours > 0
    assert _numbers(ratio)[0] == pytest.approx(ours / floor_rate, abs=0.01)
    assert "goal >= 0.80" in ratio


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_saved_shapes_still_match_transformers(arch, capsys):
    bench_embed.main(["--arch", arch, "--tiny", "--num", "8", "--len", "16", "--batch", "4"])
    out = capsys.readouterr().out
    diff = re.search(r"max \|difference\| (\S+)", out).group(1)
    assert float(diff) < 1e-4
    assert "prefill floor" in out and "[128 x 64] x [64 x 128]" in out
