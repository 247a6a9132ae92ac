"""Gemma 4 (text) on the engine against transformers' own implementation, fp32 on the CPU, tiny
random weights: a 16-token sliding window on half the layers, proportional RoPE on the full
ones, prompts of 40-70 tokens, soft-capped logits, loaded per-layer scalars; with per-layer
inputs and without; V from the K projection on the full layers; chunked prefill across the
window edge under a KV pool that forces preemption; the text part of a multimodal checkpoint;
the config's defaults, RoPE tables and parameter counts against transformers'."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    Gemma4AudioConfig,
    Gemma4Config,
    Gemma4TextConfig,
    Gemma4VisionConfig,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine import LLM, SamplingParams
from engine.models.gemma4 import Gemma4ForCausalLM
from engine.models.layers import PagedAttention
from engine.models.loader import iter_safetensors
from engine.models.model_config import FULL, SLIDING, ModelConfig
from engine.models.rope_tables import inv_freq_and_scale
from engine.runner.attention_backends import AttentionBackend
from engine.runner.forward_context import AttentionMetadata, forward_context
from tests.support.greedy_reference import assert_greedy_agrees, generate_under_pressure
from tests.support.tiny_models import EOS_ID, VOCAB, make_tiny_model

WINDOW = 16
PROMPT_LENS = [40, 47, 55, 63, 70]
NEW_TOKENS = 12
LOGPROB_ATOL = 1e-4
"""Ours against transformers' fp32 log-probabilities (as tests/test_engine_exact.py)."""
ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 1_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 50_000.0},
}


def _text_config(**extra) -> Gemma4TextConfig:
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=32,
        sliding_window=WINDOW,
        layer_types=[SLIDING, FULL, SLIDING, FULL],
        rope_parameters=ROPE,
        final_logit_softcapping=30.0,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB,
        max_position_embeddings=1024,
        eos_token_id=EOS_ID,
        bos_token_id=257,
        pad_token_id=258,
    )
    return Gemma4TextConfig(**{**fields, **extra})


def _make(config, folder):
    """A tiny model with random weights, its per-layer scalars too (transformers keeps them in
    buffers, which tests/support/tiny_models.py leaves at 1)."""
    make_tiny_model(config, folder)
    path = folder / "model.safetensors"
    weights = load_file(path)
    g = torch.Generator().manual_seed(3)
    for name in weights:
        if name.endswith("layer_scalar"):
            weights[name] = 0.5 + torch.rand(1, generator=g)
    save_file(weights, path, metadata={"format": "pt"})
    return folder, _reference(folder)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _reference(folder):
    # eager: the exact fp32 reference; transformers' default sdpa applies the sliding window
    # too (its logits came within 3e-5 of eager's on the tiny model, 70-token prompt)
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )


@pytest.fixture(scope="module")
def tiny_gemma4(tmp_path_factory):
    """Per-layer inputs on, V from K on the full layers."""
    config = _text_config(attention_k_eq_v=True, num_global_key_value_heads=2)
    config.architectures = ["Gemma4ForCausalLM"]
    return _make(config, tmp_path_factory.mktemp("tiny-gemma4"))


PARAMS = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)


def test_greedy_agrees_past_the_sliding_window(tiny_gemma4):
    folder, hf = tiny_gemma4
    outs = LLM(str(folder), device="cpu", max_model_len=128).generate(_prompts(), PARAMS)
    assert len({tuple(o.token_ids) for o in outs}) > 1, "outputs are degenerate"
    assert_greedy_agrees(hf, _prompts(), outs, logprob_atol=LOGPROB_ATOL)


def test_agrees_under_preemption_and_chunks_across_the_window_edge(tiny_gemma4):
    folder, hf = tiny_gemma4
    # 10 blocks x 16 tokens for 5 prompts of 40-70 tokens: the pool cannot hold them all; a
    # 12-token step budget splits each prompt into chunks, some straddling position 16.
    outs = generate_under_pressure(
        folder, hf, _prompts(), PARAMS, num_kv_blocks=10, step_tokens=12, max_model_len=128
    )
    assert min(o.metrics.num_prefill_chunks for o in outs) > 3


def test_without_per_layer_inputs_or_k_eq_v(tmp_path):
    config = _text_config(hidden_size_per_layer_input=0, final_logit_softcapping=None)
    config.architectures = ["Gemma4ForCausalLM"]
    folder, hf = _make(config, tmp_path)
    cfg = ModelConfig.from_folder(folder)
    assert cfg.hidden_size_per_layer_input == 0 and not cfg.k_eq_v_global
    outs = LLM(str(folder), device="cpu", max_model_len=128).generate(_prompts()[:3], PARAMS)
    assert_greedy_agrees(hf, _prompts()[:3], outs, logprob_atol=LOGPROB_ATOL)


SHARED_KV = dict(  # as gemma-4-e2b: full layers with their own head dim and KV heads, the
    # last two layers reading layers 2 and 3's K/V with double-wide MLPs
    num_hidden_layers=6,
    layer_types=[SLIDING, FULL, SLIDING, FULL, SLIDING, FULL],
    global_head_dim=64,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
)


def test_shared_kv_and_wider_full_layers_agree_under_preemption(tmp_path):
    config = _text_config(**SHARED_KV)
    config.architectures = ["Gemma4ForCausalLM"]
    folder, hf = _make(config, tmp_path)
    cfg = ModelConfig.from_folder(folder)
    assert [cfg.kv_source(i) for i in range(6)] == [None, None, None, None, 2, 3]
    assert (cfg.layer_attention(3).head_dim, cfg.layer_attention(3).num_kv_heads) == (64, 1)
    # a checkpoint may still hold the sharing layers' k/v weights: unused, as in transformers
    model = Gemma4ForCausalLM(cfg, max_positions=128)
    unused = ("model.layers.4.self_attn.k_proj.weight", torch.ones(64, 64))
    model.load_weights([*iter_safetensors(folder), unused])
    outs = generate_under_pressure(
        folder, hf, _prompts(), PARAMS, num_kv_blocks=10, step_tokens=12, max_model_len=128
    )
    assert min(o.metrics.num_prefill_chunks for o in outs) > 3


def test_the_moe_block_beside_the_dense_mlp_agrees(tmp_path):
    config = _text_config(
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32
    )
    config.architectures = ["Gemma4ForCausalLM"]
    folder, hf = _make(config, tmp_path)
    # one thread: the CPU expert loop's tiny index_add_ calls took 16-33 ms each with two
    # threads on a loaded 2-core machine, 8 us with one
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(str(folder), device="cpu", max_model_len=128)
        outs = llm.generate(_prompts()[:3], PARAMS)
    finally:
        torch.set_num_threads(threads)
    assert_greedy_agrees(hf, _prompts()[:3], outs, logprob_atol=LOGPROB_ATOL)


def test_a_kv_shared_layer_reads_the_producers_cache_and_writes_nothing():
    """One step of a decode and a prefill chunk: the producing layer stores its K/V and
    attends; a kv_shared layer bound to the same views attends with its own q over them."""
    g = torch.Generator().manual_seed(4)
    producer, reader = (PagedAttention(4, 2, 8, window=5, kv_shared=s) for s in (False, True))
    cache = torch.randn(2, 6, 4, 2, 8, generator=g)  # K, V: [blocks, block_size, kv, dim]
    for attn in (producer, reader):
        attn.k_cache, attn.v_cache, attn.backend = cache[0], cache[1], AttentionBackend()
    # sequence 0 decodes its 7th token (blocks 1, 2); sequence 1 prefills tokens 3..5 (block 3)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([2 * 4 + 2, 3 * 4 + 3, 4 * 4 + 0, 4 * 4 + 1]),
        query_start_loc=torch.tensor([0, 1, 4], dtype=torch.int32),
        seq_lens=torch.tensor([7, 6], dtype=torch.int32),
        block_tables=torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
        num_decodes=1,
        max_query_len=3,
        max_seq_len=7,
        query_start_loc_cpu=[0, 1, 4],
        seq_lens_cpu=[7, 6],
    )
    q, q2 = torch.randn(2, 4, 4, 8, generator=g)
    k, v = torch.randn(2, 4, 2, 8, generator=g)
    with forward_context(meta):
        producer(q, k, v)
        stored = cache.clone()
        out = reader(q2)
        assert torch.equal(cache, stored)
        torch.testing.assert_close(out, producer.attend(q2, meta), rtol=0, atol=0)
        reader.fuse_rope_store = True  # as start-up timing may set it on every layer
        assert reader.rope_and_store(None, None, q2, None, None) is None


def test_the_layers_are_built_as_the_config_says(tiny_gemma4):
    folder, hf = tiny_gemma4
    cfg = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = Gemma4ForCausalLM(cfg, max_positions=128)
    layers = model.attention_layers()
    assert [a.window for a in layers] == [WINDOW, None, WINDOW, None]
    assert {a.scale for a in layers} == {1.0} and not any(a.kv_shared for a in layers)
    assert [len(layer.self_attn.shard_sizes) for layer in model.layers] == [3, 2, 3, 2]
    assert model.layers[1].self_attn.rope is model.ropes[FULL]
    # every parameter transformers has, in our (fused) layout, and no other
    ours = sum(p.numel() for p in model.parameters()) - cfg.num_layers  # less layer_scalar
    assert ours == sum(p.numel() for p in hf.parameters())
    assert cfg.num_params == sum(p.numel() for p in hf.parameters())


def test_load_weights_names_missing_unexpected_and_misshapen_weights(tiny_gemma4):
    folder, _ = tiny_gemma4
    model = Gemma4ForCausalLM(ModelConfig.from_folder(folder), max_positions=128)
    weights = dict(iter_safetensors(folder))
    with pytest.raises(ValueError, match="missing weights.*layer_scalar"):
        name = "model.layers.2.layer_scalar"
        model.load_weights((k, v) for k, v in weights.items() if k != name)
    with pytest.raises(ValueError, match="unexpected weight 'layers.1.self_attn.v_proj.weight'"):
        extra = ("model.layers.1.self_attn.v_proj.weight", torch.ones(64, 64))  # a k_eq_v layer
        model.load_weights([*weights.items(), extra])
    with pytest.raises(ValueError, match="per_layer_input_gate.weight.*shape"):
        model.load_weights([("model.layers.0.per_layer_input_gate.weight", torch.ones(8, 64))])
    model.load_weights(weights.items())
    norm = weights["model.layers.1.pre_feedforward_layernorm.weight"]
    assert torch.equal(model.layers[1].pre_feedforward_layernorm.weight, norm)  # x * w


def test_text_part_of_a_multimodal_checkpoint(tmp_path, caplog):
    vision = Gemma4VisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        position_embedding_size=64,
        patch_size=4,
    )
    audio = Gemma4AudioConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        subsampling_conv_channels=[4, 4],
        output_proj_dims=16,
    )
    config = Gemma4Config(text_config=_text_config(), vision_config=vision, audio_config=audio)
    config.architectures = ["Gemma4ForConditionalGeneration"]
    folder, hf = _make(config, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "text_config" in saved and "vocab_size" not in saved
    with caplog.at_level(logging.INFO, logger="engine.models.gemma4_weights"):
        Gemma4ForCausalLM(ModelConfig.from_folder(folder), 128).load_weights(
            iter_safetensors(folder)
        )
    assert "vision and audio tower weights" in caplog.text
    outs = LLM(str(tmp_path), device="cpu", max_model_len=128).generate(_prompts()[:3], PARAMS)
    assert_greedy_agrees(hf, _prompts()[:3], outs, logprob_atol=LOGPROB_ATOL)


@pytest.mark.parametrize("head_dim", [32, 256, 512])
@pytest.mark.parametrize("factor", [None, 8.0])
def test_proportional_rope_tables_match_transformers(head_dim, factor):
    params = {**ROPE[FULL], **({"factor": factor} if factor else {})}
    config = _text_config(global_head_dim=head_dim, rope_parameters={**ROPE, FULL: params})
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](config, layer_type=FULL)
    ours, scale = inv_freq_and_scale(head_dim, params["rope_theta"], params)
    assert scale == 1.0 and ours.shape == (head_dim // 2,)
    assert torch.equal(ours, theirs)
    assert int((ours > 0).sum()) == head_dim // 8  # a quarter of the head rotates


GEMMA_4_E2B_LIKE = {  # the fields a published multimodal config.json sets, less the towers
    "architectures": ["Gemma4ForConditionalGeneration"],
    "eos_token_id": [1, 106],
    "model_type": "gemma4",
    "text_config": {
        "hidden_size": 1536,
        "intermediate_size": 6144,
        "model_type": "gemma4_text",
        "num_hidden_layers": 35,
        "num_key_value_heads": 1,
        "num_kv_shared_layers": 20,
        "use_double_wide_mlp": True,
        "final_logit_softcapping": 30.0,
    },
    "torch_dtype": "bfloat16",
}


def test_a_sparse_text_config_takes_transformers_defaults():
    cfg = ModelConfig.from_dict(GEMMA_4_E2B_LIKE)
    text = Gemma4TextConfig(**GEMMA_4_E2B_LIKE["text_config"])
    assert cfg.eos_token_id == [1, 106] and cfg.tie_word_embeddings
    assert cfg.vocab_size == text.vocab_size and cfg.sliding_window == text.sliding_window
    assert [cfg.layer_type(i) for i in range(35)] == text.layer_types
    assert cfg.layer_attention(0).rope_theta == 10_000.0
    full = cfg.layer_attention(5)
    assert (full.head_dim, full.num_kv_heads, full.rope_theta) == (512, 1, 1e6)
    assert full.rope_scaling["rope_type"] == "proportional" and full.partial_rotary_factor == 1.0
    # layers 15-34 read the last sliding (14) or full (11) layer's K/V, transformers' "store"s
    modes = text.kv_sharing_modes
    assert [i for i, mode in enumerate(modes) if mode == "store"] == [11, 14]
    sources = {i: cfg.kv_source(i) for i, mode in enumerate(modes) if mode == "reuse"}
    assert sources == {i: 11 if text.layer_types[i] == FULL else 14 for i in range(15, 35)}
    assert cfg.mlp_size(14) == 6144 and cfg.mlp_size(15) == 2 * 6144
    assert cfg.hidden_size_per_layer_input == 256 and cfg.final_logit_softcap == 30.0


def test_param_counts_match_transformers_with_sharing_moe_and_wide_mlps():
    """Shared layers (no k/v), double-wide MLPs, k_eq_v with other global dims, the MoE block
    beside the dense MLP, per-layer inputs: ModelConfig's count equals transformers' model."""
    config = _text_config(
        num_hidden_layers=6,
        layer_types=[SLIDING, FULL, SLIDING, FULL, SLIDING, FULL],
        global_head_dim=64,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=48,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
    raw = {**config.to_dict(), "architectures": ["Gemma4ForCausalLM"]}
    cfg = ModelConfig.from_dict(raw)
    assert cfg.num_params == sum(p.numel() for p in hf.parameters())
    assert cfg.layer_attention(1).head_dim == 64 and cfg.layer_attention(1).num_kv_heads == 1
    assert cfg.num_experts == 4 and cfg.moe_beside_mlp


def test_configs_the_engine_cannot_run_are_refused():
    text = dict(GEMMA_4_E2B_LIKE["text_config"])

    def parse(**changes):
        return ModelConfig.from_dict({**GEMMA_4_E2B_LIKE, "text_config": {**text, **changes}})

    with pytest.raises(ValueError, match="causal"):
        parse(use_bidirectional_attention="all")
    assert parse(use_bidirectional_attention="vision").num_layers == 35  # text stays causal
    with pytest.raises(ValueError, match="sliding layers"):
        parse(rope_parameters={**ROPE, SLIDING: {"rope_type": "yarn", "rope_theta": 1e4}})
    with pytest.raises(ValueError, match="layer_types"):
        parse(layer_types=[SLIDING] * 3)
    with pytest.raises(ValueError, match="num_kv_shared_layers"):
        parse(num_kv_shared_layers=35)
    with pytest.raises(ValueError, match="top_k_experts"):
        parse(enable_moe_block=True, num_experts=4)
    with pytest.raises(ValueError, match="per_layer_config"):
        parse(per_layer_config={"0": {"head_dim": 64}})


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("shape", ["k_eq_v", "shared_kv_moe"])
def test_gpu_greedy_agrees_past_the_window(tiny_gemma4, tmp_path, eager, shape):
    """The Triton backend's sliding window, fused norms and RoPE, CUDA graphs, fp32; the
    second model with layers reading others' K/V from pool groups of two shapes and the fused
    MoE kernel."""
    folder = tiny_gemma4[0]
    if shape == "shared_kv_moe":
        moe = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
        config = _text_config(**SHARED_KV, **moe)
        config.architectures = ["Gemma4ForCausalLM"]
        folder, _ = _make(config, tmp_path)
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
def test_gpu_agrees_under_preemption_and_chunks_across_the_window_edge(tiny_gemma4, eager):
    """The CPU test's pool and steps on the GPU (Triton attention with the window, fp32): prompts
    past the window, preemption, chunks across the window edge."""
    folder, hf = tiny_gemma4
    generate_under_pressure(
        folder, hf, _prompts(), PARAMS, num_kv_blocks=10, step_tokens=12,
        max_model_len=128, device="cuda", enforce_eager=eager,
    )  # fmt: skip
