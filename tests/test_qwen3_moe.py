"""Qwen3-MoE end to end on the CPU: greedy tokens agree with transformers' Qwen3MoeForCausalLM
with the same tiny random fp32 weights (batched, and under chunked prefill with preemption),
both checkpoint namings of the experts load, and bad checkpoints and configs are refused."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from engine import LLM, SamplingParams
from engine.models.model_config import ModelConfig
from engine.models.moe_block import MoEBlock
from tests.support.greedy_reference import assert_greedy_agrees, generate_under_pressure
from tests.support.tiny_models import EOS_ID, VOCAB, make_tiny_model

PROMPT_LENS = [3, 17, 33, 60, 90]
NEW_TOKENS = 12
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


def tiny_qwen3_moe_config() -> Qwen3MoeConfig:
    """3 layers: experts in 0 and 2, a dense MLP in 1 (mlp_only_layers); 8 experts, top-2,
    renormalised like Qwen3-30B-A3B."""
    return Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        max_position_embeddings=1024,
        eos_token_id=EOS_ID,
        bos_token_id=257,
        pad_token_id=258,
        tie_word_embeddings=False,
    )


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_model(tiny_qwen3_moe_config(), tmp_path_factory.mktemp("qwen3-moe"))
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def test_config_reads_the_experts(tiny):
    folder, _ = tiny
    cfg = ModelConfig.from_folder(folder)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 32)
    assert cfg.norm_topk_prob and cfg.qk_norm and cfg.dense_layers == (1,)
    assert [cfg.is_moe_layer(i) for i in range(3)] == [True, False, True]
    raw = json.loads((folder / "config.json").read_text())
    sparse = ModelConfig.from_dict({**raw, "mlp_only_layers": [], "decoder_sparse_step": 2})
    assert sparse.dense_layers == (0, 2)  # layer i has experts where (i + 1) % step == 0


def test_batched_greedy_agrees_with_transformers(tiny):
    folder, hf = tiny
    llm = LLM(str(folder), device="cpu")
    outs = llm.generate(_prompts(), GREEDY)
    assert len({tuple(o.token_ids) for o in outs}) > 1, "outputs are degenerate"
    assert_greedy_agrees(hf, _prompts(), outs)


def test_agrees_under_preemption_and_chunked_prefill(tiny):
    folder, hf = tiny
    # 8 blocks x 16 tokens for 5 prompts up to 102 tokens each: the pool cannot hold them all,
    # and a 24-token step budget splits the long prompts into chunks.
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    generate_under_pressure(
        folder, hf, _prompts(), params, num_kv_blocks=8, step_tokens=24, max_model_len=112
    )


def _copy_folder(src, dst, tensors: dict[str, torch.Tensor]) -> None:
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))


def test_fused_experts_load_the_same(tiny, tmp_path):
    """transformers' own parameters hold each layer's experts as two 3D tensors."""
    folder, hf = tiny
    fused = hf.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused
    _copy_folder(folder, tmp_path, fused)
    prompts = _prompts()[:2]
    a = LLM(str(folder), device="cpu").generate(prompts, GREEDY)
    b = LLM(str(tmp_path), device="cpu").generate(prompts, GREEDY)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def _per_expert_tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_missing_and_unexpected_experts_are_named(tiny, tmp_path):
    folder, _ = tiny
    tensors = _per_expert_tensors(folder)
    assert "model.layers.2.mlp.experts.7.up_proj.weight" in tensors
    missing = dict(tensors)
    del missing["model.layers.2.mlp.experts.7.up_proj.weight"]
    _copy_folder(folder, tmp_path, missing)
    with pytest.raises(ValueError, match=r"missing expert weights.*layers\.2\.mlp\.experts\.7"):
        LLM(str(tmp_path), device="cpu")
    extra = {**tensors, "model.layers.1.mlp.experts.0.up_proj.weight": torch.zeros(32, 64)}
    _copy_folder(folder, tmp_path, extra)
    with pytest.raises(ValueError, match="layer 1 has no experts"):
        LLM(str(tmp_path), device="cpu")
    extra = {**tensors, "model.layers.0.mlp.experts.8.up_proj.weight": torch.zeros(32, 64)}
    _copy_folder(folder, tmp_path, extra)
    with pytest.raises(ValueError, match="num_experts=8"):
        LLM(str(tmp_path), device="cpu")


_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed"
)
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_experts_generate_what_their_dequantized_weights_do(tiny, kind, tmp_path):
    """quantization int8 / int4 quantizes the experts too (each expert's rows, as the
    projections'); the engine then generates exactly what it generates in fp32 from the same
    weights quantized and dequantized."""
    from engine.quant.bnb import code_table, quantize_4bit, quantize_int8
    from engine.quant.reference import dequantize_ref

    folder, _ = tiny
    group = 32  # divides moe_intermediate_size, the experts' down-projection input
    tensors = _per_expert_tensors(folder)
    for name, w in tensors.items():
        if name.rsplit(".", 2)[-2] not in _PROJ:
            continue  # embeddings, norms, the routers (mlp.gate): 16-bit
        if kind == "int8":
            q, scales = quantize_int8(w)
            tensors[name] = dequantize_ref(q, scales, None, 0)
        else:
            q, scales = quantize_4bit(w, group, "nf4")
            tensors[name] = dequantize_ref(q, scales, code_table("nf4"), group)
    _copy_folder(folder, tmp_path, tensors)
    quantized = LLM(str(folder), device="cpu", quantization=kind, quant_block_size=group)
    blocks = [m for m in quantized.engine.runner.model.modules() if isinstance(m, MoEBlock)]
    assert len(blocks) == 2 and all(b.w_gate_up.dtype in (torch.int8, torch.uint8) for b in blocks)
    ours = quantized.generate(_prompts(), GREEDY)
    want = LLM(str(tmp_path), device="cpu").generate(_prompts(), GREEDY)
    assert [o.token_ids for o in ours] == [o.token_ids for o in want]


def test_config_without_expert_fields_is_refused(tiny):
    folder, _ = tiny
    raw = json.loads((folder / "config.json").read_text())
    raw.pop("num_local_experts", None)
    raw.pop("num_experts", None)
    with pytest.raises(ValueError, match="num_experts"):
        ModelConfig.from_dict(raw)


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
def test_gpu_greedy_agrees_through_the_triton_moe_kernel(tiny, eager):
    """On CUDA the MoE blocks run engine/kernels/moe.py's fused_moe (in decode CUDA graphs
    unless eager), fp32, with chunked prefill."""
    from engine.models.moe_block import _triton_moe

    folder, hf = tiny
    llm = LLM(
        str(folder),
        device="cuda",
        dtype="float32",
        enforce_eager=eager,
        max_model_len=128,
        max_num_batched_tokens=32,
        max_num_seqs=8,
    )
    assert _triton_moe() is not None
    outs = llm.generate(_prompts(), GREEDY)
    assert max(o.metrics.num_prefill_chunks for o in outs) > 1
    assert_greedy_agrees(copy.deepcopy(hf).cuda(), _prompts(), outs)


def _write_tiny_qwen3moe_gguf(path) -> None:
    """A 2-layer Qwen3-MoE GGUF in fp32 as llama.cpp lays one out: each layer's experts stacked
    (ffn_{gate,up,down}_exps), the router as ffn_gate_inp, q/k norms. transformers 5.24 does
    not read expert_feed_forward_length (it keeps Qwen3MoeConfig's 768), so the experts have
    that width."""
    import numpy as np
    from gguf import GGUFWriter, TokenType

    hidden, layers, heads, kv_heads, head_dim = 64, 2, 4, 2, 16
    experts, used, expert_ffn = 4, 2, 768
    tokens = [chr(c) for c in range(33, 127)] + ["ab", "<s>", "</s>"]
    w = GGUFWriter(str(path), "qwen3moe")
    w.add_name("tiny")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(128)
    w.add_expert_feed_forward_length(expert_ffn)
    w.add_expert_count(experts)
    w.add_expert_used_count(used)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.NORMAL] * (len(tokens) - 2) + [TokenType.CONTROL] * 2)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    rng = np.random.default_rng(0)

    def weight(*shape, mean=0.0, std=0.08):
        return (mean + rng.standard_normal(shape) * std).astype(np.float32)

    q, kv = heads * head_dim, kv_heads * head_dim
    w.add_tensor("token_embd.weight", weight(len(tokens), hidden))
    w.add_tensor("output_norm.weight", weight(hidden, mean=1.0, std=0.1))
    w.add_tensor("output.weight", weight(len(tokens), hidden))
    for i in range(layers):
        for name, shape in [
            ("attn_q", (q, hidden)),
            ("attn_k", (kv, hidden)),
            ("attn_v", (kv, hidden)),
            ("attn_output", (hidden, q)),
            ("ffn_gate_inp", (experts, hidden)),
            ("ffn_gate_exps", (experts, expert_ffn, hidden)),
            ("ffn_up_exps", (experts, expert_ffn, hidden)),
            ("ffn_down_exps", (experts, hidden, expert_ffn)),
        ]:
            w.add_tensor(
                f"blk.{i}.{name}.weight", weight(*shape, std=0.3 if "inp" in name else 0.08)
            )
        for name, size in [
            ("attn_norm", hidden),
            ("attn_q_norm", head_dim),
            ("attn_k_norm", head_dim),
            ("ffn_norm", hidden),
        ]:
            w.add_tensor(f"blk.{i}.{name}.weight", weight(size, mean=1.0, std=0.1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_qwen3moe_gguf_converts_and_agrees(tmp_path):
    """transformers' GGUF conversion keeps its fused 3D experts; they load as they are."""
    from safetensors import safe_open

    from engine.models.gguf_loader import gguf_to_hf_folder

    path = tmp_path / "tiny-qwen3moe.gguf"
    _write_tiny_qwen3moe_gguf(path)
    folder = gguf_to_hf_folder(path, cache_dir=tmp_path / "cache")
    cfg = ModelConfig.from_folder(folder)
    assert cfg.architecture == "Qwen3MoeForCausalLM" and cfg.norm_topk_prob
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (4, 2, 768)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert "model.layers.1.mlp.experts.gate_up_proj" in f.keys()
    reference = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    )
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 95, (n,), generator=g).tolist() for n in (9, 30)]
    outs = LLM(str(folder), device="cpu", max_model_len=128).generate(prompts, GREEDY)
    assert_greedy_agrees(reference, prompts, outs)


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_gpu_agrees_under_preemption_and_chunks_across_the_window_edge(tiny, eager):
    """The CPU test's pool and steps on the GPU (the Triton MoE kernels, fp32): preemption and
    chunked prefill."""
    folder, hf = tiny
    generate_under_pressure(
        folder, hf, _prompts(), GREEDY, num_kv_blocks=8, step_tokens=24,
        max_model_len=112, device="cuda", enforce_eager=eager,
    )  # fmt: skip
