"""compressed-tensors and FP8 checkpoints on the CPU, written by the compressed-tensors library
itself (tests/support/compressed_checkpoints.py): every projection we read dequantizes to the
weight the library decompresses it to (transformers loading the checkpoint decompressed), and
the engine's greedy tokens are transformers' on those weights in fp32 (teacher-forced). FP8:
per-channel and 128 x 128 block scales, and a quant_method "fp8" checkpoint's
weight_scale_inv blocks."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from engine import LLM, SamplingParams
from engine.quant.weight_format import PROJECTIONS
from tests.support.compressed_checkpoints import SCHEMES, save_compressed
from tests.support.greedy_reference import assert_greedy_agrees
from tests.support.quant_weights import projection_rows

PROMPTS = [[1, 2, 3, 4], [72, 101, 108, 108, 111, 32, 119], [200, 13, 7]]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def _decompressed(folder) -> dict[str, torch.Tensor]:
    """Each projection's weight as transformers + compressed-tensors decompress the checkpoint."""
    qc = CompressedTensorsConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, quantization_config=qc
    )
    return {
        name: module.weight.detach().float()
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in PROJECTIONS
    }


def _reference(source, weights: dict[str, torch.Tensor]):
    """The 16-bit source model (plain fp32 Linears) holding `weights`."""
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, weight in weights.items():
            model.get_submodule(name).weight.copy_(weight)
    return model


def _check(folder, source, want: dict[str, torch.Tensor]) -> LLM:
    llm = LLM(str(folder), device="cpu", max_model_len=128, num_kv_blocks=40)
    model = llm.engine.runner.model
    assert len(want) == 7 * 2
    for name, weight in want.items():
        assert torch.equal(projection_rows(model, name), weight), name
    assert_greedy_agrees(_reference(source, want), PROMPTS, llm.generate(PROMPTS, GREEDY))
    return llm


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_compressed_tensors_checkpoint_reads_as_the_library_decompresses_it(
    scheme, tiny_llama, wide_llama, tmp_path
):
    source = wide_llama if scheme.startswith("fp8") else tiny_llama
    folder = save_compressed(source, tmp_path / scheme, *SCHEMES[scheme])
    llm = _check(folder, source, _decompressed(folder))
    qkv = llm.engine.runner.model.layers[0].self_attn.qkv_proj
    kind = {"w4": "int4", "w8": "int8", "fp": "fp8"}[scheme[:2]]
    assert qkv.quantized.kind == kind and (qkv.zeros is not None) == ("asym" in scheme)
    if scheme == "fp8-block":  # a block's scale repeated on its 128 rows: 128 / 128 groups
        assert qkv.scales.shape == (3 * 128, 1)
    with pytest.raises(ValueError, match="already quantized"):
        LLM(str(folder), device="cpu", quantization="int4" if kind != "int4" else "int8")


def test_an_fp8_checkpoint_with_weight_scale_inv_blocks(wide_llama, tmp_path):
    """quant_method "fp8" (e4m3 weights, a weight_scale_inv multiplier per 128 x 128 block):
    each weight is the codes times its block's scale."""
    tensors, want = {}, {}
    for name, t in load_file(wide_llama / "model.safetensors").items():
        prefix = name.removesuffix(".weight")
        if name == prefix or prefix.rsplit(".", 1)[-1] not in PROJECTIONS:
            tensors[name] = t
            continue
        n, k = t.shape
        blocks = t.float().view(n // 128, 128, k // 128, 128)
        scale = blocks.abs().amax((1, 3)) / 448.0  # [N / 128, K / 128]
        codes = (blocks / scale[:, None, :, None]).view(n, k).to(torch.float8_e4m3fn)
        tensors[name], tensors[f"{prefix}.weight_scale_inv"] = codes, scale
        full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
        want[prefix] = codes.float() * full
    folder = tmp_path / "fp8"
    folder.mkdir()
    save_file(tensors, folder / "model.safetensors")
    config = json.loads((wide_llama / "config.json").read_text())
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128]}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config | {"quantization_config": qc}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((wide_llama / name).read_bytes())
    _check(folder, wide_llama, want)
