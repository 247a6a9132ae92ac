"""The engine with INT8 / INT4 weights on the CPU: quantized at load time it generates exactly
what the engine generates from the dequantized weights in fp32; a checkpoint transformers +
bitsandbytes quantized loads and matches transformers running it; the embedded SmolLM2 still
knows its capitals; bad settings fail with a clear ValueError."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine import LLM, SamplingParams
from engine.quant.bnb import code_table, quantize_4bit, quantize_int8
from engine.quant.format import WeightQuant, checkpoint_quant
from engine.quant.reference import dequantize_ref
from tests.tiny_models import byte_tokenizer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed"
)
PROMPTS = [[1, 2, 3, 4], [72, 101, 108, 108, 111, 32, 119], [200, 13, 7]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _engine(folder, **kw) -> LLM:
    return LLM(folder, device="cpu", max_model_len=128, num_kv_blocks=40, **kw)


def _greedy(llm: LLM) -> list[list[int]]:
    return [out.token_ids for out in llm.generate(PROMPTS, GREEDY)]


def _hf_model(folder, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, device_map="cpu", **kw).eval()


@pytest.fixture(scope="module", params=["int8", "int4"])
def dequantized(request, tiny_llama, tmp_path_factory):
    """(kind, folder of the tiny Llama with its projections quantized and dequantized, fp32)."""
    kind = request.param
    model = _hf_model(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in _PROJ:
                w = module.weight
                if kind == "int8":
                    q, s = quantize_int8(w)
                    w.copy_(dequantize_ref(q, s, None, 0))
                else:
                    q, s = quantize_4bit(w, 64, "nf4")
                    w.copy_(dequantize_ref(q, s, code_table("nf4"), 64))
    folder = tmp_path_factory.mktemp(f"dequantized-{kind}")
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return kind, folder


def test_quantized_engine_matches_dequantized_weights(tiny_llama, dequantized):
    kind, folder = dequantized
    llm = _engine(tiny_llama, quantization=kind)
    layer = llm.engine.runner.model.layers[0]
    assert type(layer.self_attn.qkv_proj).__name__ == "QuantLinear"
    assert layer.mlp.down_proj.qweight.dtype == (torch.int8 if kind == "int8" else torch.uint8)
    assert _greedy(llm) == _greedy(_engine(folder))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_loads_a_bitsandbytes_checkpoint_and_matches_transformers(kind, tiny_llama, tmp_path):
    from transformers import BitsAndBytesConfig

    if kind == "int8":
        qc = BitsAndBytesConfig(load_in_8bit=True)
    else:
        qc = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )
    hf = _hf_model(tiny_llama, quantization_config=qc, dtype=torch.float32)
    hf.save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    ours = _greedy(_engine(tmp_path))  # quantization comes from config.json
    with torch.no_grad():
        for prompt, tokens in zip(PROMPTS, ours):
            ids = torch.tensor([prompt])
            out = hf.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
            assert out[0, len(prompt) :].tolist() == tokens
    with pytest.raises(ValueError, match="already quantized"):
        _engine(tmp_path, quantization="int4" if kind == "int8" else "int8")


def test_embedded_model_int8_still_answers():
    llm = LLM(device="cpu", quantization="int8", max_model_len=256, num_kv_blocks=32)
    params = SamplingParams(max_tokens=3, temperature=0.0)
    (out,) = llm.generate(["The capital of France is"], params)
    assert "Paris" in out.text, out.text


def test_bad_settings_fail_clearly(tiny_llama):
    with pytest.raises(ValueError, match="quantization must be one of"):
        _engine(tiny_llama, quantization="int3")
    with pytest.raises(ValueError, match="quant_block_size must be even"):
        _engine(tiny_llama, quantization="int4", quant_block_size=33)
    with pytest.raises(ValueError, match="must divide"):  # hidden size 64
        _engine(tiny_llama, quantization="int4", quant_block_size=128)
    with pytest.raises(ValueError, match="bitsandbytes quantizes 4-bit weights in blocks of"):
        _engine(tiny_llama, quantization="int4", quant_block_size=48)
    with pytest.raises(ValueError, match="quant_type"):
        checkpoint_quant({"quant_method": "bitsandbytes", "load_in_4bit": True,
                          "bnb_4bit_quant_type": "int4"}, 64)  # fmt: skip
    assert WeightQuant("int4").group_size == 64


def test_auto_stays_16_bit(tiny_llama):
    llm = _engine(tiny_llama, quantization="auto")
    assert isinstance(llm.engine.runner.model.layers[0].mlp.down_proj, torch.nn.Linear)


def _quant_dequant(w: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "int8":
        return dequantize_ref(*quantize_int8(w), None, 0)
    return dequantize_ref(*quantize_4bit(w, 64, "nf4"), code_table("nf4"), 64)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # untied and tied embeddings
def test_quantized_embeddings_and_head_match_dequantized_weights(kind, arch, tmp_path):
    from tests.tiny_models import make_tiny_model

    folder = make_tiny_model(arch, tmp_path / "model")
    model = _hf_model(folder, dtype=torch.float32)
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in (*_PROJ, "lm_head", "embed_tokens"):
                module.weight.copy_(_quant_dequant(module.weight, kind))  # a tied pair: twice
    ref_folder = tmp_path / "dequantized"
    model.save_pretrained(ref_folder)
    byte_tokenizer().save_pretrained(ref_folder)

    llm = _engine(folder, quantization=kind, quantize_embeddings=True)
    ours = llm.engine.runner.model
    assert type(ours.lm_head).__name__ == "QuantLinear"
    assert type(ours.embed_tokens).__name__ == "QuantEmbedding"
    assert (ours.embed_tokens.table is ours.lm_head) == (arch == "qwen2")
    assert _greedy(llm) == _greedy(_engine(ref_folder))


def test_quantize_embeddings_without_quantized_weights_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="quantize_embeddings needs quantized weights"):
        _engine(tiny_llama, quantize_embeddings=True)
