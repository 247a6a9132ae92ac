"""RoPE types (default, linear, llama3, YaRN) and partial rotary against transformers: the
inverse frequencies and cos/sin tables against its ROPE_INIT_FUNCTIONS, the rotation against
its apply_rotary_pos_emb, the config parsing, and greedy tokens of tiny Llamas with linear
and YaRN scaling against transformers' own model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPTNeoXConfig, GptOssConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from engine import LLM, SamplingParams
from engine.models import rope_tables as rope_mod
from engine.models.config_fields import ROPE_TYPES
from engine.models.layers import PagedAttention
from engine.models.model_config import ModelConfig
from engine.models.rope_tables import RotaryEmbedding, inv_freq_and_scale
from tests.support.greedy_reference import assert_greedy_agrees
from tests.support.tiny_models import _COMMON, make_tiny_model

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 128,
}
GPT_OSS_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
CASES = {
    # name: (head_dim, theta, rope_parameters without rope_theta, partial_rotary_factor)
    "default": (128, 10000.0, {"rope_type": "default"}, 1.0),
    "default-partial": (80, 10000.0, {"rope_type": "default"}, 0.4),
    "linear-gemma3": (256, 1e6, {"rope_type": "linear", "factor": 8.0}, 1.0),
    "linear-partial": (64, 1e6, {"rope_type": "linear", "factor": 4.0}, 0.5),
    "llama3": (128, 500000.0, LLAMA3, 1.0),
    "yarn-gpt-oss": (64, 150000.0, GPT_OSS_YARN, 1.0),
    "yarn-truncated": (128, 10000.0, {**GPT_OSS_YARN, "truncate": True, "factor": 4.0}, 1.0),
    "yarn-mscale": (
        64,
        10000.0,
        {**GPT_OSS_YARN, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707},
        1.0,
    ),
    "yarn-attention-factor": (64, 10000.0, {**GPT_OSS_YARN, "attention_factor": 1.1}, 1.0),
    "yarn-partial": (128, 150000.0, GPT_OSS_YARN, 0.25),
}


def _hf_config(head_dim, theta, params, partial):
    """A transformers config of the right shape: gpt-oss's for YaRN, GPT-NeoX's for partial
    default RoPE (Llama's ignores the factor), Llama's otherwise."""
    rope_parameters = {**params, "rope_theta": theta}
    if partial != 1.0:
        rope_parameters["partial_rotary_factor"] = partial
    cls = GptOssConfig if params["rope_type"] == "yarn" else LlamaConfig
    if params["rope_type"] == "default" and partial != 1.0:
        cls = GPTNeoXConfig
    return cls(
        head_dim=head_dim, hidden_size=4 * head_dim, num_attention_heads=4,
        rope_parameters=rope_parameters,
    )  # fmt: skip


def _hf_inv_freq(config):
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        rotary = (
            GPTNeoXRotaryEmbedding if isinstance(config, GPTNeoXConfig) else LlamaRotaryEmbedding
        )
        return rotary.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config)


def test_every_accepted_type_has_a_table_builder():
    assert set(rope_mod._SCALINGS) == set(ROPE_TYPES)


@pytest.mark.parametrize("case", CASES)
def test_tables_equal_transformers(case):
    """Bit-equal inverse frequencies (a last-bit difference turns into 0.01 rad at position
    131072) and attention factor; the cos/sin tables then equal transformers' up to the last
    bit of the fp32 cos/sin (its angles go through a matmul)."""
    head_dim, theta, params, partial = CASES[case]
    config = _hf_config(head_dim, theta, params, partial)
    expect_inv, expect_scale = _hf_inv_freq(config)
    scaling = None if params["rope_type"] == "default" else params
    rope = RotaryEmbedding(head_dim, 4096, theta, scaling, partial)
    got_inv, got_scale = inv_freq_and_scale(rope.rotary_dim, theta, scaling)
    assert rope.rotary_dim == int(head_dim * partial) == 2 * expect_inv.numel()
    assert torch.equal(got_inv, expect_inv)
    assert got_scale == pytest.approx(expect_scale, rel=1e-15)
    positions = torch.arange(4096, dtype=torch.float32)
    angles = torch.outer(positions, expect_inv)  # [4096, rotary_dim // 2]
    angles = torch.cat([angles, angles], dim=-1)
    assert rope.cos.shape == (4096, rope.rotary_dim)
    torch.testing.assert_close(rope.cos, angles.cos() * expect_scale, atol=1e-6, rtol=0)
    torch.testing.assert_close(rope.sin, angles.sin() * expect_scale, atol=1e-6, rtol=0)


def test_yarn_tables_equal_gpt_oss_rotary_embedding():
    """gpt-oss's own rotary module (its cos/sin carry the attention factor, 1.3466 here) at
    positions past the original 4096."""
    config = _hf_config(64, 150000.0, GPT_OSS_YARN, 1.0)
    positions = torch.tensor([[0, 1, 4095, 4096, 70000, 131071]])
    cos, sin = GptOssRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions)
    rope = RotaryEmbedding(64, 131072, 150000.0, GPT_OSS_YARN)
    # gpt-oss keeps one half of the rotate-half table
    torch.testing.assert_close(rope.cos[positions[0], :32], cos[0], atol=2e-6, rtol=0)
    torch.testing.assert_close(rope.sin[positions[0], :32], sin[0], atol=2e-6, rtol=0)
    assert rope.cos[0, 0].item() == pytest.approx(1.3465736, rel=1e-6)


@pytest.mark.parametrize("partial", [0.25, 0.5, 1.0])
def test_partial_rotation_equals_transformers_on_the_rotated_dims(partial):
    head_dim, theta = 64, 10000.0
    rope = RotaryEmbedding(head_dim, 512, theta, {"rope_type": "linear", "factor": 2.0}, partial)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(9, 4, head_dim, generator=g)  # [num_tokens, num_heads, head_dim]
    k = torch.randn(9, 2, head_dim, generator=g)
    positions = torch.randint(0, 512, (9,), generator=g)
    got_q, got_k = rope(positions, q, k)
    dim = rope.rotary_dim
    cos, sin = rope.cos[positions], rope.sin[positions]  # [num_tokens, rotary_dim]
    # transformers: [batch, heads, seq, dim] with cos [batch, seq, dim]
    hf_q, hf_k = apply_rotary_pos_emb(
        q[..., :dim].transpose(0, 1)[None], k[..., :dim].transpose(0, 1)[None], cos[None], sin[None]
    )
    torch.testing.assert_close(got_q[..., :dim], hf_q[0].transpose(0, 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(got_k[..., :dim], hf_k[0].transpose(0, 1), atol=1e-6, rtol=0)
    assert torch.equal(got_q[..., dim:], q[..., dim:])  # the rest pass through
    assert torch.equal(got_k[..., dim:], k[..., dim:])
    assert rope.is_partial == (partial < 1)


def test_partial_rope_never_takes_the_fused_store():
    attn = PagedAttention(4, 2, 64)
    attn.fuse_rope_store = True
    rope = RotaryEmbedding(64, 16, 10000.0, None, 0.5)
    q, k = torch.zeros(1, 4, 64), torch.zeros(1, 2, 64)
    assert attn.rope_and_store(rope, torch.zeros(1, dtype=torch.long), q, k, k) is None


@pytest.mark.parametrize("factor, message", [(0.3, "must be even"), (0.0, r"in \(0, 1\]")])
def test_a_bad_partial_factor_says_what_is_wrong(factor, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(64, 16, 10000.0, None, factor)


def _raw(**extra):
    return {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, **extra,
    }  # fmt: skip


def test_config_accepts_each_type_and_carries_it_to_the_layers():
    cfg = ModelConfig.from_dict(_raw(rope_scaling={"type": "linear", "factor": 8.0}))
    assert cfg.layer_attention(1).rope_scaling == {"type": "linear", "factor": 8.0,
                                                   "rope_type": "linear"}  # fmt: skip
    cfg = ModelConfig.from_dict(_raw(rope_theta=150000.0, rope_scaling=GPT_OSS_YARN))
    att = cfg.layer_attention(0)
    assert (att.rope_theta, att.rope_scaling, att.partial_rotary_factor) == (
        150000.0, GPT_OSS_YARN, 1.0,
    )  # fmt: skip
    cfg = ModelConfig.from_dict(_raw(rope_parameters=LLAMA3, partial_rotary_factor=0.5))
    assert cfg.layer_attention(0).partial_rotary_factor == 0.5
    assert RotaryEmbedding.for_layer(cfg.layer_attention(0), 8).rotary_dim == 8
    assert (
        ModelConfig.from_dict(_raw(rope_parameters={"rope_type": "default"})).rope_scaling is None
    )


def test_config_rejects_unknown_types_and_missing_keys():
    with pytest.raises(ValueError, match="'dynamic'; supported: default, linear, llama3, yarn"):
        ModelConfig.from_dict(_raw(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    with pytest.raises(ValueError, match="'yarn' needs original_max_position_embeddings"):
        ModelConfig.from_dict(_raw(rope_scaling={"rope_type": "yarn", "factor": 2.0}))


SCALED_LLAMAS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    # a short original context, so the ramp covers dims the prompts reach
    "yarn": {**GPT_OSS_YARN, "factor": 8.0, "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("kind", SCALED_LLAMAS)
def test_scaled_llama_greedy_agrees_with_transformers(kind, tmp_path):
    config = LlamaConfig(
        **_COMMON,
        rope_parameters={**SCALED_LLAMAS[kind], "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    folder = make_tiny_model(config, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 90)]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = LLM(str(folder), device="cpu").generate(prompts, greedy)
    assert len({tuple(o.token_ids) for o in outs}) > 1
    assert_greedy_agrees(hf, prompts, outs)
