"""Gemma 3 (text) on the engine against transformers' own implementation, fp32 on the CPU, tiny
random weights: a 16-token sliding window on three of four layers, linear RoPE scaling on the
full one, prompts of 40-70 tokens, soft-capped logits; chunked prefill across the window edge
under a KV pool that forces preemption; the text part of a multimodal checkpoint; a GGUF file
through transformers' GGUF conversion; the config's defaults.

transformers 5.24's Gemma 3 reads attn_logit_softcapping but never applies it (Gemma3Attention
does not pass it to its attention function; published Gemma 3 configs leave it null), so the
attention soft-cap is checked to reach our attention layers, not against transformers."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

from engine import LLM, SamplingParams
from engine.models.gemma3 import Gemma3ForCausalLM
from engine.models.gguf_loader import gguf_to_hf_folder, restore_gemma3_config
from engine.models.loader import iter_safetensors
from engine.models.model_config import FULL, SLIDING, ModelConfig
from tests.support.greedy_reference import assert_greedy_agrees, generate_under_pressure
from tests.support.tiny_models import EOS_ID, VOCAB, make_tiny_model

WINDOW = 16
PROMPT_LENS = [40, 47, 55, 63, 70]
NEW_TOKENS = 12
LOGPROB_ATOL = 1e-4
"""Ours against transformers' fp32 log-probabilities (as tests/test_engine_exact.py)."""


def _text_config(**extra) -> Gemma3TextConfig:
    return Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=WINDOW,
        layer_types=[SLIDING, FULL, SLIDING, SLIDING],
        rope_theta=50_000.0,
        rope_local_base_freq=1_000.0,
        query_pre_attn_scalar=24,
        max_position_embeddings=1024,
        eos_token_id=EOS_ID,
        bos_token_id=257,
        pad_token_id=258,
        **extra,
    )


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _reference(folder):
    # eager: transformers' sdpa path applies the sliding window too, but not the soft-cap
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gemma3")
    linear = {"rope_type": "linear", "factor": 8.0}  # the global layers' (as 4B and up)
    config = _text_config(final_logit_softcapping=5.0, rope_scaling=linear)
    config.architectures = ["Gemma3ForCausalLM"]
    make_tiny_model(config, folder)
    return folder, _reference(folder)


PARAMS = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)


def test_greedy_agrees_past_the_sliding_window(tiny_gemma3):
    folder, hf = tiny_gemma3
    outs = LLM(str(folder), device="cpu", max_model_len=128).generate(_prompts(), PARAMS)
    assert len({tuple(o.token_ids) for o in outs}) > 1, "outputs are degenerate"
    assert_greedy_agrees(hf, _prompts(), outs, logprob_atol=LOGPROB_ATOL)


def test_agrees_under_preemption_and_chunks_across_the_window_edge(tiny_gemma3):
    folder, hf = tiny_gemma3
    # 10 blocks x 16 tokens for 5 prompts of 40-70 tokens: the pool cannot hold them all; a
    # 12-token step budget splits each prompt into chunks, some straddling position 16.
    outs = generate_under_pressure(
        folder, hf, _prompts(), PARAMS, num_kv_blocks=10, step_tokens=12, max_model_len=128
    )
    assert min(o.metrics.num_prefill_chunks for o in outs) > 3


def test_the_window_scale_and_soft_cap_reach_the_attention_layers(tiny_gemma3):
    folder, _ = tiny_gemma3
    raw = json.loads((folder / "config.json").read_text())
    cfg = ModelConfig.from_dict({**raw, "attn_logit_softcapping": 8.0})
    with torch.device("meta"):
        model = Gemma3ForCausalLM(cfg, max_positions=128)
    layers = model.attention_layers()
    assert [a.window for a in layers] == [WINDOW, None, WINDOW, WINDOW]
    assert {a.softcap for a in layers} == {8.0} and {a.scale for a in layers} == {24**-0.5}
    assert model.layers[1].self_attn.rope is model.ropes[FULL]
    assert model.layers[2].self_attn.rope is model.ropes[SLIDING]
    model.init_buffers(torch.device("cpu"))
    local, full = model.ropes[SLIDING], model.ropes[FULL]
    assert local.cos.shape == full.cos.shape == (128, 32)
    assert not torch.equal(local.cos, full.cos)  # bases 1,000 and 50,000
    assert full.scaling["factor"] == 8.0 and local.scaling is None


def test_load_weights_names_missing_unexpected_and_misshapen_weights(tiny_gemma3):
    folder, _ = tiny_gemma3
    model = Gemma3ForCausalLM(ModelConfig.from_folder(folder), max_positions=128)
    weights = dict(iter_safetensors(folder))
    with pytest.raises(ValueError, match="missing weights.*post_feedforward_layernorm"):
        name = "model.layers.2.post_feedforward_layernorm.weight"
        model.load_weights((k, v) for k, v in weights.items() if k != name)
    with pytest.raises(ValueError, match="unexpected weight 'layers.0.mlp.gate.weight'"):
        model.load_weights([*weights.items(), ("model.layers.0.mlp.gate.weight", torch.ones(1))])
    with pytest.raises(ValueError, match="q_norm.weight.*shape"):
        model.load_weights([("model.layers.0.self_attn.q_norm.weight", torch.ones(64))])
    model.load_weights(weights.items())
    norm = weights["model.layers.1.pre_feedforward_layernorm.weight"]
    assert torch.equal(model.layers[1].pre_feedforward_layernorm.weight, norm + 1)


def test_text_part_of_a_multimodal_checkpoint(tmp_path):
    vision = SiglipVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    config = Gemma3Config(text_config=_text_config(), vision_config=vision, mm_tokens_per_image=4)
    config.architectures = ["Gemma3ForConditionalGeneration"]
    make_tiny_model(config, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "text_config" in saved and "vocab_size" not in saved
    hf = _reference(tmp_path)
    outs = LLM(str(tmp_path), device="cpu", max_model_len=128).generate(_prompts()[:3], PARAMS)
    assert_greedy_agrees(hf, _prompts()[:3], outs, logprob_atol=LOGPROB_ATOL)


GEMMA_3_12B_IT = {  # google/gemma-3-12b-it's config.json less vision_config
    "architectures": ["Gemma3ForConditionalGeneration"],
    "eos_token_id": [1, 106],
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "model_type": "gemma3_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
}


def test_a_sparse_text_config_takes_transformers_defaults():
    cfg = ModelConfig.from_dict(GEMMA_3_12B_IT)
    assert (cfg.vocab_size, cfg.head_dim, cfg.query_pre_attn_scalar) == (262_208, 256, 256)
    assert cfg.eos_token_id == [1, 106] and cfg.tie_word_embeddings
    assert cfg.torch_dtype == "bfloat16"
    assert [cfg.layer_type(i) for i in range(6)] == [SLIDING] * 5 + [FULL]
    assert cfg.layer_attention(0).rope_theta == 10_000.0
    assert cfg.layer_attention(5).rope_theta == 1_000_000.0
    assert cfg.layer_attention(5).sliding_window is None
    assert cfg.layer_attention(5).rope_scaling == {
        "rope_type": "linear",
        "factor": 8.0,
        "rope_theta": 1_000_000.0,
    }
    assert cfg.layer_attention(0).rope_scaling is None
    assert cfg.layer_attention(0).sliding_window == 1024
    # published: 10,759M parameters besides the embeddings (Gemma 3 technical report, table 1)
    counts = cfg.param_counts()
    assert counts.total - counts.embed == pytest.approx(10_759e6, rel=0.01)


def test_configs_the_engine_cannot_run_are_refused():
    text = dict(GEMMA_3_12B_IT["text_config"])
    with pytest.raises(ValueError, match="sliding layers"):
        bad = {"sliding_attention": {"rope_type": "yarn", "factor": 2.0}}
        ModelConfig.from_dict({**GEMMA_3_12B_IT, "text_config": {**text, "rope_parameters": bad}})
    with pytest.raises(ValueError, match="layer_types"):
        ModelConfig.from_dict(
            {**GEMMA_3_12B_IT, "text_config": {**text, "layer_types": [SLIDING] * 3}}
        )
    with pytest.raises(ValueError, match="causal"):
        ModelConfig.from_dict(
            {**GEMMA_3_12B_IT, "text_config": {**text, "use_bidirectional_attention": True}}
        )


def _write_tiny_gemma3_gguf(path) -> None:
    """A 6-layer Gemma 3 GGUF in fp32 as llama.cpp writes one: (1 + w) norm weights, every sixth
    layer full (a GGUF has no layer types; transformers fills in Gemma 3's pattern)."""
    from gguf import GGUFWriter, TokenType

    hidden, layers, heads, kv_heads, head_dim, ffn = 64, 6, 4, 2, 32, 128
    tokens = ["<pad>", "<eos>", "<bos>"] + [chr(c) for c in range(33, 127)] + ["ab"]
    w = GGUFWriter(str(path), "gemma3")
    w.add_name("tiny")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(50_000.0)
    w.add_sliding_window(WINDOW)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (len(tokens) - 3))
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    rng = np.random.default_rng(0)

    def weight(*shape, mean=0.0, std=0.08):
        return (mean + rng.standard_normal(shape) * std).astype(np.float32)

    w.add_tensor("token_embd.weight", weight(len(tokens), hidden))
    w.add_tensor("output_norm.weight", weight(hidden, mean=1.0, std=0.1))
    q, kv = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        for name, shape in [
            ("attn_q", (q, hidden)),
            ("attn_k", (kv, hidden)),
            ("attn_v", (kv, hidden)),
            ("attn_output", (hidden, q)),
            ("ffn_gate", (ffn, hidden)),
            ("ffn_up", (ffn, hidden)),
            ("ffn_down", (hidden, ffn)),
        ]:
            w.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
        for name, size in [
            ("attn_norm", hidden),
            ("attn_q_norm", head_dim),
            ("attn_k_norm", head_dim),
            ("post_attention_norm", hidden),
            ("ffn_norm", hidden),
            ("post_ffw_norm", hidden),
        ]:
            w.add_tensor(f"blk.{i}.{name}.weight", weight(size, mean=1.0, std=0.1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gemma3_gguf_converts_and_agrees(tmp_path):
    path = tmp_path / "tiny-gemma3.gguf"
    _write_tiny_gemma3_gguf(path)
    folder = gguf_to_hf_folder(path, cache_dir=tmp_path / "cache")
    cfg = ModelConfig.from_folder(folder)
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.sliding_window == WINDOW
    assert [cfg.layer_type(i) for i in range(6)] == [SLIDING] * 5 + [FULL]
    reference = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in (30, 45)]
    outs = LLM(str(folder), device="cpu", max_model_len=128).generate(prompts, PARAMS)
    assert_greedy_agrees(reference, prompts, outs, logprob_atol=LOGPROB_ATOL)


def test_gguf_conversion_restores_linear_rope_and_the_27b_scale():
    full = {"rope_type": "default", "rope_theta": 1e6}
    config = SimpleNamespace(
        rope_parameters={"full_attention": full, "sliding_attention": {"rope_type": "default"}},
        num_hidden_layers=62,
        hidden_size=5376,
        num_attention_heads=32,
        query_pre_attn_scalar=256,
    )
    meta = {"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0}
    restore_gemma3_config(config, meta)
    assert full == {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}
    assert config.query_pre_attn_scalar == 168  # gemma-3-27b-it's config.json value
    config.num_hidden_layers, config.query_pre_attn_scalar = 48, 256  # 12B: head_dim's
    restore_gemma3_config(config, {})
    assert config.query_pre_attn_scalar == 256


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
def test_gpu_greedy_agrees_past_the_window(tiny_gemma3, eager):
    """The Triton backend's sliding window, fused norms and CUDA graphs, fp32."""
    folder, _ = tiny_gemma3
    llm = LLM(
        str(folder),
        device="cuda",
        dtype="float32",
        enforce_eager=eager,
        max_model_len=128,
        max_num_batched_tokens=32,
        max_num_seqs=8,
    )
    assert llm.engine.runner.backend.name == "triton"
    outs = llm.generate(_prompts(), PARAMS)
    assert max(o.metrics.num_prefill_chunks for o in outs) > 1
    assert_greedy_agrees(_reference(folder).cuda(), _prompts(), outs)


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_gpu_agrees_under_preemption_and_chunks_across_the_window_edge(tiny_gemma3, eager):
    """The CPU test's pool and steps on the GPU (Triton attention with the window, fp32): prompts
    past the window, preemption, chunks across the window edge."""
    folder, hf = tiny_gemma3
    generate_under_pressure(
        folder, hf, _prompts(), PARAMS, num_kv_blocks=10, step_tokens=12,
        max_model_len=128, device="cuda", enforce_eager=eager,
    )  # fmt: skip
