"""Gemma4MoE against transformers' Gemma4TextRouter + Gemma4TextExperts with the same random
weights (fp32, ragged expert loads, experts with no tokens), its routing against a per-token
loop written from the definition, int8 experts against the 16-bit block, the checkpoint names.
tests/test_gemma4_moe_kernel.py runs the block through the Triton fused_moe."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from engine.models.gemma4_moe import CHECKPOINT_NAMES, Gemma4MoE
from engine.models.model_config import ModelConfig
from engine.quant.weight_format import WeightQuant

HIDDEN, INTER, EXPERTS, TOP_K, EPS = 32, 16, 16, 4, 1e-6
HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


def _cfg(**overrides) -> ModelConfig:
    fields = dict(
        architecture="Gemma4ForCausalLM",
        vocab_size=64,
        hidden_size=HIDDEN,
        intermediate_size=48,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        rms_norm_eps=EPS,
        rope_theta=10_000.0,
        rope_scaling=None,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        qk_norm=True,
        sliding_window=None,
        torch_dtype="float32",
        eos_token_id=[1],
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=INTER,
    )
    return ModelConfig(**{**fields, **overrides})


def _checkpoint(seed: int) -> dict[str, torch.Tensor]:
    """Random weights under the checkpoint's layer-relative names; the scales and norm weights
    away from one so that each of them is exercised."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {
        "router.proj.weight": (EXPERTS, HIDDEN),
        "router.scale": (HIDDEN,),
        "router.per_expert_scale": (EXPERTS,),
        "experts.gate_up_proj": (EXPERTS, 2 * INTER, HIDDEN),
        "experts.down_proj": (EXPERTS, HIDDEN, INTER),
        "pre_feedforward_layernorm_2.weight": (HIDDEN,),
        "post_feedforward_layernorm_2.weight": (HIDDEN,),
    }
    weights = {}
    for name, shape in shapes.items():
        w = torch.randn(shape, generator=gen)
        weights[name] = 1 + 0.3 * w if len(shape) == 1 else w / math.sqrt(shape[-1])
    return weights


def _ours(weights: dict[str, torch.Tensor]) -> Gemma4MoE:
    block = Gemma4MoE(_cfg())
    for name, tensor in weights.items():
        block.load_checkpoint_weight(name, tensor)
    return block


def _transformers(weights: dict[str, torch.Tensor]):
    """transformers' router, experts and the two norms, and their composition as
    Gemma4TextDecoderLayer runs them."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import (
        Gemma4RMSNorm,
        Gemma4TextExperts,
        Gemma4TextRouter,
    )

    config = Gemma4TextConfig(
        hidden_size=HIDDEN,
        rms_norm_eps=EPS,
        enable_moe_block=True,
        num_experts=EXPERTS,
        top_k_experts=TOP_K,
        moe_intermediate_size=INTER,
        hidden_activation="gelu_pytorch_tanh",
    )
    parts = torch.nn.ModuleDict(
        dict(
            router=Gemma4TextRouter(config),
            experts=Gemma4TextExperts(config),
            pre_feedforward_layernorm_2=Gemma4RMSNorm(HIDDEN, eps=EPS),
            post_feedforward_layernorm_2=Gemma4RMSNorm(HIDDEN, eps=EPS),
        )
    )
    parts.load_state_dict(weights, strict=True)

    def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _, weights, ids = parts.router(x)
        out = parts.experts(parts.pre_feedforward_layernorm_2(x), ids, weights)
        return parts.post_feedforward_layernorm_2(out), weights, ids

    return run


@pytest.mark.parametrize("num_tokens", [1, 5, 37])
def test_block_matches_transformers_router_and_experts(num_tokens):
    weights = _checkpoint(seed=num_tokens)
    gen = torch.Generator().manual_seed(3)
    # a direction every token shares: the router favours a few experts, others get no token
    x = 2 * torch.randn(num_tokens, HIDDEN, generator=gen) + 3 * torch.randn(HIDDEN, generator=gen)
    want, want_weights, want_ids = _transformers(weights)(x)
    block = _ours(weights)
    with torch.no_grad():
        got_weights, got_ids = block.route(x)
        got = block(x)
    loads = torch.bincount(got_ids.flatten(), minlength=EXPERTS)
    assert (loads == 0).any(), "some experts receive no token"
    if num_tokens > 1:
        assert loads[loads > 0].unique().numel() > 1, "expert loads are ragged"
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_weights, want_weights, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _loop_route(weights: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[list, list]:
    """Per token, in float64 Python arithmetic, from the definition."""
    proj = weights["router.proj.weight"].double().tolist()
    scale = weights["router.scale"].double().tolist()
    per_expert = weights["router.per_expert_scale"].double().tolist()
    all_weights, all_ids = [], []
    for row in x.double().tolist():
        rms = math.sqrt(sum(v * v for v in row) / HIDDEN + EPS)
        h = [v / rms * s / math.sqrt(HIDDEN) for v, s in zip(row, scale)]
        logits = [sum(a * b for a, b in zip(w, h)) for w in proj]
        top = max(logits)
        probs = [math.exp(v - top) for v in logits]
        chosen = sorted(range(EXPERTS), key=lambda e: -probs[e])[:TOP_K]
        total = sum(probs[e] for e in chosen)
        all_weights.append([probs[e] / total * per_expert[e] for e in chosen])
        all_ids.append(chosen)
    return all_weights, all_ids


def test_routing_matches_a_per_token_loop():
    weights = _checkpoint(seed=21)
    x = torch.randn(19, HIDDEN, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got_weights, got_ids = _ours(weights).route(x)
    want_weights, want_ids = _loop_route(weights, x)
    assert got_weights.dtype == torch.float32 and got_ids.shape == (19, TOP_K)
    assert got_ids.tolist() == want_ids
    torch.testing.assert_close(
        got_weights.double(), torch.tensor(want_weights, dtype=torch.float64), rtol=1e-5, atol=1e-6
    )


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed")
def test_int8_experts_stay_close_to_the_16_bit_block():
    weights = _checkpoint(seed=8)
    x = torch.randn(23, HIDDEN, generator=torch.Generator().manual_seed(9))
    block = _ours(weights)
    with torch.no_grad():
        want = block(x)
        block.quantize_experts(WeightQuant("int8"))
        got = block(x)
    assert block.w_gate_up.dtype == torch.int8 and block.router.proj.weight.dtype == torch.float32
    rel = (got - want).norm() / want.norm()
    assert 0 < rel < 2e-2, f"int8 experts: relative error {rel:.4f}"


def test_checkpoint_names_cover_every_parameter_and_refuse_others():
    block = Gemma4MoE(_cfg())
    assert set(CHECKPOINT_NAMES.values()) == {n for n, _ in block.named_parameters()}
    with pytest.raises(ValueError, match="unexpected Gemma 4 MoE weight 'router.bias'"):
        block.load_checkpoint_weight("router.bias", torch.zeros(EXPERTS))
    with pytest.raises(ValueError, match=r"shape \(16, 2, 32\), expected \(16, 32, 32\)"):
        block.load_checkpoint_weight("experts.gate_up_proj", torch.zeros(EXPERTS, 2, HIDDEN))


def test_a_config_without_experts_is_refused():
    with pytest.raises(ValueError, match="num_experts, top_k_experts and moe_intermediate_size"):
        Gemma4MoE(_cfg(num_experts=0))
