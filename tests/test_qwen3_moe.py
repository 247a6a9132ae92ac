"""Qwen3-MoE end to end on the CPU: greedy tokens agree with transformers' Qwen3MoeForCausalLM
with the same tiny random fp32 weights (batched, and under chunked prefill with preemption),
both checkpoint namings of the experts load, and bad checkpoints and configs are refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from engine import LLM, SamplingParams
from engine.models.config import ModelConfig
from tests.support.greedy_reference import assert_greedy_agrees
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
    llm = LLM(
        str(folder),
        device="cpu",
        num_kv_blocks=8,
        max_num_batched_tokens=24,
        max_model_len=112,
        max_num_seqs=5,
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = llm.generate(_prompts(), params)
    assert_greedy_agrees(hf, _prompts(), outs, logprob_atol=1e-4)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert max(o.metrics.num_prefill_chunks for o in outs) > 1
    assert llm.engine.block_manager.num_free_blocks == 8


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


def test_config_without_expert_fields_is_refused(tiny):
    folder, _ = tiny
    raw = json.loads((folder / "config.json").read_text())
    raw.pop("num_local_experts", None)
    raw.pop("num_experts", None)
    with pytest.raises(ValueError, match="num_experts"):
        ModelConfig.from_dict(raw)
