"""Qwen3.5-MoE (qwen3_5_moe): config parsing and parameter counts against transformers' own
model, the shared expert on MoEBlock against transformers' sparse MoE block, and the text model
end to end on the CPU: greedy tokens agree with transformers' Qwen3_5MoeForCausalLM with the same
tiny random fp32 weights (short and long prompts, chunked prefill, a tight KV pool forcing
preemption)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3_5MoeTextConfig

from engine.models.linear_attention import LINEAR
from engine.models.model_config import FULL, ModelConfig

NUM_EXPERTS, TOP_K = 8, 2


def tiny_moe_config(**overrides) -> Qwen3_5MoeTextConfig:
    """4 layers: linear, linear, linear, full; 8 experts, 2 per token, a shared expert of a
    different size than the routed ones."""
    fields = dict(
        vocab_size=320,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        architectures=["Qwen3_5MoeForCausalLM"],
    )
    return Qwen3_5MoeTextConfig(**{**fields, **overrides})


def test_fields_from_a_text_config():
    cfg = ModelConfig.from_dict(tiny_moe_config().to_dict())
    assert cfg.architecture == "Qwen3_5MoeForCausalLM"
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 32)
    assert cfg.shared_expert_intermediate_size == 64 and cfg.norm_topk_prob
    assert cfg.dense_layers == () and all(cfg.is_moe_layer(i) for i in range(4))
    assert cfg.attn_output_gate and cfg.qk_norm and cfg.partial_rotary_factor == 0.25


def test_a_multimodal_checkpoint_reads_its_text_config():
    text = tiny_moe_config().to_dict()
    raw = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {k: v for k, v in text.items() if k != "architectures"},
        "vision_config": {"depth": 2},
    }
    cfg = ModelConfig.from_dict(raw)
    assert cfg.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert cfg.num_params == ModelConfig.from_dict(text).num_params


def test_param_counts_equal_transformers_numel():
    config = tiny_moe_config()
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config)
    cfg = ModelConfig.from_dict(config.to_dict())
    counts = cfg.param_counts()
    assert counts.total == sum(p.numel() for p in hf.parameters())
    experts = sum(p.numel() for n, p in hf.named_parameters() if ".mlp.experts." in n)
    assert counts.experts == experts
    # one token reads 2 of each layer's 8 experts, the shared expert and everything else
    assert counts.total - counts.active == experts * (NUM_EXPERTS - TOP_K) // NUM_EXPERTS


def test_a_bad_expert_count_is_refused():
    with pytest.raises(ValueError, match="num_experts_per_tok=9 must be between 1 and"):
        ModelConfig.from_dict(tiny_moe_config(num_experts_per_tok=9).to_dict())


def test_moe_block_with_a_shared_expert_equals_transformers_sparse_block():
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

    from engine.models.llama import MLP
    from engine.models.moe_block import MoEBlock, softmax_topk_renormalized

    config = tiny_moe_config()
    cfg = ModelConfig.from_dict(config.to_dict())
    torch.manual_seed(1)
    hf = Qwen3_5MoeSparseMoeBlock(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    ours = MoEBlock(
        64,
        32,
        NUM_EXPERTS,
        TOP_K,
        softmax_topk_renormalized,
        shared_expert=MLP(cfg, cfg.shared_expert_intermediate_size),
    )
    with torch.no_grad():
        ours.gate.weight.copy_(hf.gate.weight)
        ours.w_gate_up.copy_(hf.experts.gate_up_proj)
        ours.w_down.copy_(hf.experts.down_proj)
        shared = hf.shared_expert
        ours.shared_expert.gate_up_proj.weight.copy_(
            torch.cat([shared.gate_proj.weight, shared.up_proj.weight])
        )
        ours.shared_expert.down_proj.weight.copy_(shared.down_proj.weight)
        ours.shared_expert_gate.weight.copy_(hf.shared_expert_gate.weight)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))  # [num_tokens, hidden]
    with torch.no_grad():
        want = hf(x[None])[0]  # [5, hidden]
        got = ours(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --- the model end to end ------------------------------------------------------------------------
PROMPT_LENS = [1, 2, 17, 150]
"""Shorter than the conv's 3 remembered inputs, under one chunk of the delta rule (64), three."""


def _prompts(lens=PROMPT_LENS, seed=2) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lens]


def _greedy(max_tokens: int = 8):
    from engine import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.support.tiny_models import EOS_ID, VOCAB, make_tiny_model

    config = tiny_moe_config(vocab_size=VOCAB, eos_token_id=EOS_ID, max_position_embeddings=1024)
    folder = make_tiny_model(config, tmp_path_factory.mktemp("qwen3_5_moe"))
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def _llm(folder, **kwargs):
    from engine import LLM

    return LLM(str(folder), device="cpu", max_model_len=256, **kwargs)


def test_greedy_agrees_short_and_long_prompts(tiny):
    from engine.models.moe_block import MoEBlock
    from tests.support.greedy_reference import assert_greedy_agrees

    folder, hf = tiny
    llm = _llm(folder)
    model = llm.engine.runner.model
    assert type(model).__name__ == "Qwen3_5MoeForCausalLM"
    assert all(isinstance(layer.mlp, MoEBlock) for layer in model.layers)
    outs = llm.generate(_prompts(), _greedy())
    assert_greedy_agrees(hf, _prompts(), outs, logprob_atol=1e-4)


def test_chunked_prefill_and_prefills_beside_decodes(tiny):
    """Chunks of at most 24 tokens carry the linear layers' state across steps; three requests
    at once put later prompts' chunks beside earlier ones' decodes."""
    from tests.support.greedy_reference import assert_greedy_agrees

    folder, hf = tiny
    prompts = _prompts([5, 70, 150])
    llm = _llm(folder, max_num_batched_tokens=24, max_num_seqs=3)
    outs = llm.generate(prompts, _greedy())
    assert max(o.metrics.num_prefill_chunks for o in outs) >= 6  # 150 tokens by 24 or fewer
    assert_greedy_agrees(hf, prompts, outs, logprob_atol=1e-4)


def test_tight_kv_pool_preempts_and_recomputes(tiny):
    from tests.support.greedy_reference import generate_under_pressure

    folder, hf = tiny
    # 3 prompts of up to 76 tokens in 16-token blocks need up to 14 blocks; 8 preempt
    outs = generate_under_pressure(
        folder,
        hf,
        _prompts([40, 50, 60]),
        _greedy(16),
        num_kv_blocks=8,
        step_tokens=32,
        max_model_len=128,
    )
    assert all(len(o.token_ids) == 16 for o in outs)


def test_a_checkpoint_missing_an_expert_is_refused(tiny, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder, _ = tiny
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (weights,) = broken.glob("*.safetensors")
    tensors = load_file(weights)
    missing = next(n for n in tensors if n.endswith("layers.2.mlp.experts.7.up_proj.weight"))
    del tensors[missing]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing expert weights.*layers\.2\.mlp\.experts\.7"):
        _llm(broken)


PROJECTIONS = {"gate_proj", "up_proj", "down_proj", "q_proj", "k_proj", "v_proj", "o_proj"}
PROJECTIONS |= {"in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj"}
"""The checkpoint's quantized projections: experts, the shared expert, attention and the
Gated DeltaNet's; the routers, the shared expert's gate, norms and conv taps stay 16-bit."""


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_generates_what_its_dequantized_weights_do(tiny, kind, tmp_path):
    """int8 / int4 quantize the experts (each expert's rows as one weight's) and the shared
    expert like every projection; the engine then generates what it generates in fp32 from the
    same weights quantized and dequantized."""
    pytest.importorskip("bitsandbytes")
    from safetensors.torch import load_file, save_file

    from engine.quant.bnb import code_table, quantize_4bit, quantize_int8
    from engine.quant.modules import QuantLinear
    from engine.quant.reference import dequantize_ref

    folder, _ = tiny
    group = 32  # divides every projection's input width
    tensors = load_file(folder / "model.safetensors")
    for name, w in tensors.items():
        if name.rsplit(".", 2)[-2] not in PROJECTIONS:
            continue
        if kind == "int8":
            tensors[name] = dequantize_ref(*quantize_int8(w), None, 0)
        else:
            q, scales = quantize_4bit(w, group, "nf4")
            tensors[name] = dequantize_ref(q, scales, code_table("nf4"), group)
    save_file(tensors, tmp_path / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    quantized = _llm(folder, quantization=kind, quant_block_size=group)
    block = quantized.engine.runner.model.layers[0].mlp
    assert block.quant is not None and block.quant.kind == kind
    assert isinstance(block.shared_expert.gate_up_proj, QuantLinear)
    prompts = _prompts([5, 70])
    ours = quantized.generate(prompts, _greedy())
    want = _llm(tmp_path).generate(prompts, _greedy())
    assert [o.token_ids for o in ours] == [o.token_ids for o in want]


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
def test_gpu_greedy_agrees_through_the_triton_kernels(tiny, eager):
    """On CUDA the MoE blocks run engine/kernels/moe.py's fused_moe and the linear layers the
    Gated DeltaNet kernels (in decode CUDA graphs unless eager), fp32, with chunked prefill."""
    import copy

    from engine import LLM
    from engine.models.moe_block import _triton_moe
    from tests.support.greedy_reference import assert_greedy_agrees

    folder, hf = tiny
    llm = LLM(
        str(folder),
        device="cuda",
        dtype="float32",
        enforce_eager=eager,
        max_model_len=256,
        max_num_batched_tokens=48,
        max_num_seqs=8,
    )
    assert _triton_moe() is not None
    outs = llm.generate(_prompts(), _greedy())
    assert max(o.metrics.num_prefill_chunks for o in outs) > 1
    assert_greedy_agrees(copy.deepcopy(hf).cuda(), _prompts(), outs)
    slots = llm.engine.block_manager.slots
    assert slots.num_free == slots.num_slots
