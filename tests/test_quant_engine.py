"""The engine with INT8 / INT4 weights on the CPU: quantized at load time it generates exactly
what the engine generates from the dequantized weights in fp32; a checkpoint transformers +
bitsandbytes quantized loads to what bitsandbytes itself dequantizes it to, and generates what
those weights in fp32 generate (transformers' teacher-forced log-probs agree); the embedded
SmolLM2 still knows its capitals; bad settings fail with a clear ValueError.

No reference here runs bitsandbytes' matmuls: on CPUs with AVX512-BF16, bitsandbytes 0.50.2's
Linear4bit.forward repacks the weights and computes in bf16 even with an fp32 compute dtype, so
its tokens depend on the CPU (a 2-core AMD EPYC: token 6 of a prompt, 237 against 210)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import iter_safetensors
from engine.quant.bnb import code_table, quantize_4bit, quantize_int8
from engine.quant.checkpoints import checkpoint_quant
from engine.quant.reference import dequantize_ref
from engine.quant.weight_format import WeightQuant
from tests.support.tiny_models import byte_tokenizer

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


def _save_bnb_checkpoint(kind: str, tiny_llama, folder) -> None:
    """The tiny Llama as transformers + bitsandbytes quantize and save it (int8: LLM.int8;
    int4: NF4 in 64-weight blocks, the quant_block_size the engine defaults to)."""
    from transformers import BitsAndBytesConfig

    if kind == "int8":
        qc = BitsAndBytesConfig(load_in_8bit=True)
    else:
        qc = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )
    _hf_model(tiny_llama, quantization_config=qc, dtype=torch.float32).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)


def _bnb_dequantized(folder, kind: str) -> dict[str, torch.Tensor]:
    """Each quantized projection of the checkpoint ("model.layers.0.self_attn.q_proj") -> its
    weight as bitsandbytes itself dequantizes the saved tensors, fp32 [N, K]."""
    import bitsandbytes.functional as bnb_f

    tensors = dict(iter_safetensors(folder))
    out = {}
    for name, t in tensors.items():
        prefix = name.removesuffix(".weight")
        if name == prefix or prefix.rsplit(".", 1)[-1] not in _PROJ:
            continue
        if kind == "int8":
            out[prefix] = bnb_f.int8_vectorwise_dequant(t, tensors[f"{prefix}.SCB"])
        else:
            parts = {
                k.removeprefix(name + "."): v
                for k, v in tensors.items()
                if k.startswith(name + ".")
            }
            state = bnb_f.QuantState.from_dict(parts, device=torch.device("cpu"))
            out[prefix] = bnb_f.dequantize_4bit(t, state)
    assert len(out) == 7 * 2  # seven projections in each of the two layers
    return out


def _our_rows(model, name: str) -> torch.Tensor:
    """A checkpoint projection's rows of our (fused) QuantLinear, dequantized to fp32."""
    cfg = model.config
    path, proj = name.removeprefix("model.").rsplit(".", 1)
    fused, shard = LlamaForCausalLM._FUSED.get(proj, (proj, 0))
    weight = model.get_submodule(f"{path}.{fused}").dequantize()
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    sizes = {"qkv_proj": [q, kv, kv], "gate_up_proj": [cfg.intermediate_size] * 2}
    if fused not in sizes:
        return weight
    return weight.narrow(0, sum(sizes[fused][:shard]), sizes[fused][shard])


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_loads_a_bitsandbytes_checkpoint_as_bitsandbytes_dequantizes_it(kind, tiny_llama, tmp_path):
    """Loading, apart from any matmul: every projection read from the checkpoint (its Q/K/V and
    gate/up rows fused) dequantizes to bitsandbytes' own dequantization of the saved tensors:
    int4 bit for bit; int8 within fp32 rounding (bitsandbytes multiplies q * SCB by 1/127, we
    multiply q by SCB / 127)."""
    _save_bnb_checkpoint(kind, tiny_llama, tmp_path)
    model = _engine(tmp_path).engine.runner.model  # quantization comes from config.json
    for name, want in _bnb_dequantized(tmp_path, kind).items():
        got = _our_rows(model, name)
        if kind == "int4":
            assert torch.equal(got, want), name
        else:
            torch.testing.assert_close(got, want, rtol=2**-22, atol=0, msg=name)
    with pytest.raises(ValueError, match="already quantized"):
        _engine(tmp_path, quantization="int4" if kind == "int8" else "int8")


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_bitsandbytes_checkpoint_generates_what_its_weights_do_in_fp32(
    kind, tiny_llama, tmp_path
):
    """End to end against fp32 references, the same on every CPU: the engine on the
    checkpoint gives the greedy tokens of the engine on an fp32 copy of the model whose
    projections hold bitsandbytes' dequantization of the checkpoint, and teacher-forced over
    those tokens its log-probs are transformers' on that copy, within fp32 summation order."""
    from engine.runner.scoring import iter_next_token_logprobs

    _save_bnb_checkpoint(kind, tiny_llama, tmp_path / "bnb")
    reference = _hf_model(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        for name, weight in _bnb_dequantized(tmp_path / "bnb", kind).items():
            reference.get_submodule(name).weight.copy_(weight)
    reference.save_pretrained(tmp_path / "fp32")
    byte_tokenizer().save_pretrained(tmp_path / "fp32")

    llm = _engine(tmp_path / "bnb")
    ours = _greedy(llm)
    assert ours == _greedy(_engine(tmp_path / "fp32"))
    for prompt, tokens in zip(PROMPTS, ours):
        seq = prompt + tokens
        got = torch.cat([lp for _, lp in iter_next_token_logprobs(llm.engine, seq)])
        with torch.no_grad():
            logits = reference(torch.tensor([seq])).logits[0, :-1].float()
        torch.testing.assert_close(got, torch.log_softmax(logits, -1), rtol=0, atol=1e-4)


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
        checkpoint_quant(
            {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "int4"},
            64,
        )
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
    from tests.support.tiny_models import make_tiny_model

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
