"""gpt-oss end to end on the CPU: greedy tokens agree with transformers' GptOssForCausalLM
(eager attention: sinks and the sliding window) with the same tiny random fp32 weights, for
prompts longer than the window, batched and under chunked prefill across the window edge with
preemption; MXFP4 experts load dequantized; bad checkpoints and configs are refused; the
gpt-oss-20b profile's parameter counts match the published ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GptOssConfig
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from engine import LLM, SamplingParams
from engine.models.model_config import FULL, SLIDING, ModelConfig
from engine.quant.mxfp4 import dequantize_mxfp4, gate_up_rows_first
from tests.support.greedy_reference import assert_greedy_agrees, generate_under_pressure
from tests.support.tiny_models import EOS_ID, VOCAB, make_tiny_model

WINDOW = 16
PROMPT_LENS = [5, 40, 55, 70]
NEW_TOKENS = 10
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
PROFILE = Path(__file__).parents[1] / "profiles" / "models" / "gpt-oss-20b.json"


def tiny_gpt_oss_config() -> GptOssConfig:
    """3 layers (sliding, full, sliding: transformers' default alternation), 4 experts, top-2,
    a 16-token window, gpt-oss's YaRN RoPE (the config's default)."""
    return GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=WINDOW,
        max_position_embeddings=1024,
        eos_token_id=EOS_ID,
        bos_token_id=257,
        pad_token_id=258,
        tie_word_embeddings=False,
    )


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model, with sinks of about the logits' size (so they take real weight) and
    gate/up weights large enough that the SwiGLU clamp at 7 bites."""
    folder = make_tiny_model(tiny_gpt_oss_config(), tmp_path_factory.mktemp("gpt-oss"))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(4, generator=g))
            layer.mlp.experts.gate_up_proj.mul_(12.0)
    hf.save_pretrained(folder)
    assert hf.config._attn_implementation == "eager"
    return folder, hf


def test_config_reads_gpt_oss(tiny):
    folder, _ = tiny
    cfg = ModelConfig.from_folder(folder)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (4, 2, 32)
    assert cfg.layer_types == (SLIDING, FULL, SLIDING)
    layers = [cfg.layer_attention(i) for i in range(3)]
    assert [a.sliding_window for a in layers] == [WINDOW, None, WINDOW]
    assert all(a.sinks and a.rope_scaling["rope_type"] == "yarn" for a in layers)
    assert layers[0].rope_scaling["truncate"] is False and cfg.rope_theta == 150000.0
    assert cfg.qkv_bias and cfg.o_bias and all(cfg.is_moe_layer(i) for i in range(3))
    raw = json.loads((folder / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "mxfp4"}  # dequantized by the model's loader
    assert ModelConfig.from_dict(raw).quantization_config is None


def test_batched_greedy_agrees_with_transformers(tiny):
    folder, hf = tiny
    llm = LLM(str(folder), device="cpu")
    outs = llm.generate(_prompts(), GREEDY)
    assert len({tuple(o.token_ids) for o in outs}) > 1, "outputs are degenerate"
    assert_greedy_agrees(hf, _prompts(), outs)


def test_window_and_sinks_change_the_reference(tiny):
    """What the greedy tests check matters: over a 70-token prompt, transformers' top token
    changes at many positions without the sinks (-1e4: zero weight) or without the window."""
    _, hf = tiny
    prompt = torch.tensor([_prompts()[-1]])
    layers, config = hf.model.layers, hf.config

    def top_tokens() -> torch.Tensor:
        with torch.no_grad():
            return hf(prompt).logits[0].argmax(-1)  # [70]

    base = top_tokens()
    sinks = [layer.self_attn.sinks.detach().clone() for layer in layers]
    try:
        for layer in layers:
            layer.self_attn.sinks.data.fill_(-1e4)
        without_sinks = top_tokens()
        for layer, s in zip(layers, sinks, strict=True):
            layer.self_attn.sinks.data.copy_(s)
        config.sliding_window = 4096  # transformers builds the sliding mask from the config
        without_window = top_tokens()
    finally:
        config.sliding_window = WINDOW
        for layer, s in zip(layers, sinks, strict=True):
            layer.self_attn.sinks.data.copy_(s)
    assert torch.equal(top_tokens(), base)
    assert (without_sinks != base).float().mean() > 0.2
    assert (without_window[WINDOW:] != base[WINDOW:]).float().mean() > 0.2


def test_agrees_under_preemption_and_chunked_prefill(tiny):
    folder, hf = tiny
    # 7 blocks x 16 tokens for 4 prompts up to 80 tokens: the pool cannot hold them all, and
    # 12-token steps split the long prompts into chunks that cross the 16-token window.
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    generate_under_pressure(
        folder, hf, _prompts(), params, num_kv_blocks=7, step_tokens=12, max_model_len=96
    )


def _copy_folder(src: Path, dst: Path, tensors: dict[str, torch.Tensor]) -> None:
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))


def _random_mxfp4(shape: tuple[int, int, int], g: torch.Generator) -> dict[str, torch.Tensor]:
    """Blocks and scales of a random MXFP4 weight [E, rows, cols]: every code, and scales
    2^-7 .. 2^-3 (values up to 0.75, about the tiny model's weights)."""
    e, rows, cols = shape
    blocks = torch.randint(0, 256, (e, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 125, (e, rows, cols // 32), generator=g, dtype=torch.uint8)
    return {"_blocks": blocks, "_scales": scales}


def test_mxfp4_experts_load_dequantized(tiny, tmp_path):
    """gpt-oss-20b's layout: experts as MXFP4 blocks and scales, gate/up rows interleaved. Our
    experts hold the dequantized values in our layout, and greedy tokens agree with a
    transformers model holding transformers' own dequantization of the same bytes."""
    folder, _ = tiny
    tensors = load_file(str(folder / "model.safetensors"))
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    g = torch.Generator().manual_seed(4)
    for i, layer in enumerate(reference.model.layers):
        experts = layer.mlp.experts
        for proj, shape in (("gate_up_proj", (4, 64, 64)), ("down_proj", (4, 64, 32))):
            del tensors[f"model.layers.{i}.mlp.experts.{proj}"]
            packed = _random_mxfp4(shape, g)
            for kind, t in packed.items():
                tensors[f"model.layers.{i}.mlp.experts.{proj}{kind}"] = t
            hf_weight = convert_moe_packed_tensors(*packed.values(), dtype=torch.float32)
            getattr(experts, proj).data.copy_(hf_weight)  # transformers' [E, in, out]
    _copy_folder(folder, tmp_path, tensors)

    llm = LLM(str(tmp_path), device="cpu")
    block = llm.engine.runner.model.layers[2].mlp
    hf_experts = reference.model.layers[2].mlp.experts
    packed_gate_up = (
        tensors[f"model.layers.2.mlp.experts.gate_up_proj{k}"] for k in ("_blocks", "_scales")
    )
    ours = dequantize_mxfp4(*packed_gate_up, torch.float32)  # [E, 2I, H] interleaved rows
    assert torch.equal(block.w_gate_up, gate_up_rows_first(ours))
    assert torch.equal(block.w_gate_up, gate_up_rows_first(hf_experts.gate_up_proj.mT))
    assert torch.equal(block.w_down, hf_experts.down_proj.mT)
    outs = llm.generate(_prompts(), GREEDY)
    assert_greedy_agrees(reference, _prompts(), outs)


def test_missing_unpaired_and_unexpected_experts_are_named(tiny, tmp_path):
    folder, _ = tiny
    tensors = load_file(str(folder / "model.safetensors"))
    missing = dict(tensors)
    del missing["model.layers.1.mlp.experts.down_proj_bias"]
    _copy_folder(folder, tmp_path, missing)
    with pytest.raises(ValueError, match=r"missing expert weights.*layers\.1\.mlp.*down_proj_bias"):
        LLM(str(tmp_path), device="cpu")
    unpaired = dict(tensors)
    del unpaired["model.layers.0.mlp.experts.down_proj"]
    unpaired["model.layers.0.mlp.experts.down_proj_blocks"] = torch.zeros(
        4, 64, 1, 16, dtype=torch.uint8
    )
    _copy_folder(folder, tmp_path, unpaired)
    with pytest.raises(ValueError, match="down_proj_blocks"):
        LLM(str(tmp_path), device="cpu")
    extra = {**tensors, "model.layers.3.mlp.experts.down_proj_bias": torch.zeros(4, 64)}
    _copy_folder(folder, tmp_path, extra)
    with pytest.raises(ValueError, match="num_hidden_layers=3"):
        LLM(str(tmp_path), device="cpu")
    wrong = {**tensors, "model.layers.0.mlp.experts.down_proj": torch.zeros(4, 64, 32)}
    _copy_folder(folder, tmp_path, wrong)
    with pytest.raises(ValueError, match=r"shape \(4, 64, 32\), expected \(4, 32, 64\)"):
        LLM(str(tmp_path), device="cpu")


def test_bad_configs_are_refused(tiny, tmp_path):
    folder, _ = tiny
    raw = json.loads((folder / "config.json").read_text())
    with pytest.raises(ValueError, match="num_local_experts"):
        ModelConfig.from_dict({**raw, "num_local_experts": None})
    with pytest.raises(ValueError, match="layer_types must list 3"):
        ModelConfig.from_dict({**raw, "layer_types": [SLIDING, FULL]})
    with pytest.raises(ValueError, match="sliding_window is not set"):
        ModelConfig.from_dict({**raw, "sliding_window": None})
    _copy_folder(folder, tmp_path, load_file(str(folder / "model.safetensors")))
    (tmp_path / "config.json").write_text(json.dumps({**raw, "swiglu_limit": 10.0}))
    with pytest.raises(ValueError, match="swiglu_limit=10.0"):
        LLM(str(tmp_path), device="cpu")


def test_gpt_oss_20b_parameter_counts():
    """OpenAI's gpt-oss model card (arXiv 2508.10925, table 1): 20.91B parameters, 3.61B
    active per token, counting the unembedding but not the embedding table (a token reads one
    row of it). Our counts leave out the biases (7M: expert biases 6.6M, attention 0.2M)."""
    cfg = ModelConfig.from_dict(json.loads(PROFILE.read_text()))
    counts = cfg.param_counts()
    assert counts.total == pytest.approx(20.91e9, rel=0.01)
    unembedding = cfg.vocab_size * cfg.hidden_size
    assert counts.active - unembedding == pytest.approx(3.61e9, rel=0.01)
    assert cfg.layer_types == (SLIDING, FULL) * 12 and cfg.sliding_window == 128


def test_gpt_oss_20b_builds_the_checkpoint_shapes():
    """On the meta device: our layers hold the released checkpoint's tensors once dequantized
    (gate_up_proj_blocks [32, 5760, 90, 16] -> [32, 5760, 2880]; down_proj square, 2880 x
    2880), and every parameter is counted by param_counts or is a bias."""
    from engine.models.gpt_oss import GptOssForCausalLM

    cfg = ModelConfig.from_dict(json.loads(PROFILE.read_text()))
    with torch.device("meta"):
        model = GptOssForCausalLM(cfg, max_positions=256)
    block = model.layers[0].mlp
    assert block.w_gate_up.shape == (32, 5760, 90 * 32) and block.w_down.shape == (32, 2880, 2880)
    assert block.b_gate_up.shape == (32, 5760) and block.gate.bias.shape == (32,)
    windows = [layer.self_attn.attn.window for layer in model.layers]
    assert windows == [128, None] * 12
    assert model.layers[1].self_attn.attn.sinks.shape == (64,)
    q, kv, h = 64 * 64, 8 * 64, 2880
    biases = 24 * ((q + 2 * kv + h) + 32 * (2 * 2880 + h) + 32)  # attention, experts, router
    assert sum(p.numel() for p in model.parameters()) == cfg.param_counts().total + biases


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_gpu_agrees_under_preemption_and_chunks_across_the_window_edge(tiny, eager):
    """The CPU test's pool and steps on the GPU (Triton attention with sinks and the window, the
    MoE kernels with biases and the clamped SwiGLU, fp32): prompts past the window, preemption,
    chunks across the window edge."""
    folder, hf = tiny
    generate_under_pressure(
        folder, hf, _prompts(), GREEDY, num_kv_blocks=7, step_tokens=12,
        max_model_len=96, device="cuda", enforce_eager=eager,
    )  # fmt: skip
