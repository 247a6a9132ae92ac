"""AWQ and GPTQ checkpoints on the CPU, packed by tests/support/quant_packers.py from the
formats' descriptions: every projection we read dequantizes to exactly the weight the packed
tensors stand for (zero points, v1's off-by-one, desc_act's scattered groups, 8 bits), and the
engine's greedy tokens are transformers' on those weights in fp32 (teacher-forced). Formats
and variants not served are refused by name, and a contradicting `quantization` too."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.quant.checkpoints import checkpoint_quant
from tests.support.greedy_reference import assert_greedy_agrees
from tests.support.quant_packers import CHECKPOINTS, write_checkpoint
from tests.support.quant_weights import projection_rows

PROMPTS = [[1, 2, 3, 4], [72, 101, 108, 108, 111, 32, 119], [200, 13, 7]]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def _reference(source, exact: dict[str, torch.Tensor]):
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, weight in exact.items():
            model.get_submodule(name).weight.copy_(weight)
    return model


@pytest.mark.parametrize("case", list(CHECKPOINTS))
def test_reads_the_checkpoint_exactly_and_generates_what_its_weights_do(case, tiny_llama, tmp_path):
    qc = CHECKPOINTS[case]
    exact = write_checkpoint(tiny_llama, tmp_path / case, qc)
    llm = LLM(str(tmp_path / case), device="cpu", max_model_len=128, num_kv_blocks=40)
    model = llm.engine.runner.model
    for name, want in exact.items():
        assert torch.equal(projection_rows(model, name), want), name
    qkv = model.layers[0].self_attn.qkv_proj
    assert (qkv.perm is not None) == qc.get("desc_act", False)
    assert (qkv.zeros is not None) == (not qc.get("sym", False))
    if case == "gptq-8bit-sym-channel-v2":  # the kernels' own int8 layout: row scales
        assert qkv.quantized.is_kernel_layout and qkv.scales.dim() == 1
    outs = llm.generate(PROMPTS, GREEDY)
    assert_greedy_agrees(_reference(tiny_llama, exact), PROMPTS, outs)
    with pytest.raises(ValueError, match="already quantized"):
        LLM(str(tmp_path / case), device="cpu", quantization="int4" if qc["bits"] == 8 else "int8")


REFUSED = {  # quantization_config -> what the message names
    "AWQ version 'gemv'": {"quant_method": "awq", "bits": 4, "version": "gemv"},
    "GPTQ with 3 bits": {"quant_method": "gptq", "bits": 3, "group_size": 128},
    "GPTQ checkpoint_format 'marlin'": {"quant_method": "gptq", "bits": 4,
                                        "checkpoint_format": "marlin"},
    "compressed-tensors sparsity 'sparse-24-bitmask'": {
        "quant_method": "compressed-tensors", "format": "sparse-24-bitmask",
        "sparsity_config": {"format": "sparse-24-bitmask"}, "config_groups": {}},
    "'exl2'": {"quant_method": "exl2"},
    "'mxfp4' outside gpt-oss": {"quant_method": "mxfp4"},
    "FP8 'e5m2'": {"quant_method": "fp8", "fmt": "e5m2"},
}  # fmt: skip


@pytest.mark.parametrize("named", list(REFUSED))
def test_unserved_variants_are_refused_by_name(named):
    with pytest.raises(ValueError) as e:
        checkpoint_quant(REFUSED[named], 64)
    assert named in str(e.value) and "supported: bitsandbytes" in str(e.value)
    assert "AWQ (4-bit, GEMM packing)" in str(e.value)


def test_fp8_is_only_an_fp8_checkpoint(tiny_llama):
    with pytest.raises(ValueError, match="reads an FP8 checkpoint's weights"):
        LLM(str(tiny_llama), device="cpu", quantization="fp8")


def test_the_plan_counts_the_checkpoint_layout(tiny_llama, tmp_path):
    """The planner counts AWQ's half byte a weight plus a scale and a zero point per group of
    32, and names the layout (what `appliance profile` prints)."""
    from engine.planner.formulas import WeightLayout, quantized_bytes

    write_checkpoint(tiny_llama, tmp_path / "awq", CHECKPOINTS["awq"])
    plan = LLM(str(tmp_path / "awq"), device="cpu", max_model_len=128).engine.plan
    assert plan.quantization == "int4"
    assert "int4 (awq, groups of 32, zero points)" in plan.weight_format
    assert "0.5 B a weight + 8 B a group of 32 (scale, zero point)" in plan.weight_format
    assert quantized_bytes(WeightLayout(4, 32, True), 64 * 128, 64) == 64 * 64 + 8 * 256
    assert quantized_bytes(WeightLayout(8, 0, False), 64 * 128, 64) == 64 * 128 + 4 * 64
