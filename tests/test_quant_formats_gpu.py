"""Checkpoint formats on a GPU (bf16 activations, CUDA graphs): AWQ, GPTQ (tests/support/
quant_packers.py) and compressed-tensors / FP8 (tests/support/compressed_checkpoints.py).
Every quantized projection of the loaded model, at the row counts that take each path of
engine/quant/dispatch.py's table (the GEMV, the tl.dot GEMM, dequantize + cuBLAS; the
reference path for zero points; torch._scaled_mm for per-channel FP8), equals x @ W.T on the
weight it dequantizes to within bf16's (or FP8 activations') rounding, and the engine
generates from them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.quant.modules import QuantLinear
from tests.support.quant_packers import CHECKPOINTS, write_checkpoint

pytestmark = pytest.mark.gpu
ROWS = (1, 7, 40)
"""One row (the GEMV), a decode batch (the GEMM), a prefill chunk (dequantize + cuBLAS)."""
PROMPTS = [[1, 2, 3, 4], [72, 101, 108, 108, 111, 32, 119], [200, 13, 7]]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def _check_projections(llm: LLM, tol: float) -> list[QuantLinear]:
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, QuantLinear)]
    assert layers
    g = torch.Generator(device="cuda").manual_seed(0)
    for layer in layers:
        w = layer.dequantize().cuda()
        for rows in ROWS:
            x = torch.randn(rows, layer.in_features, device="cuda", generator=g)
            x = x.to(torch.bfloat16)
            with torch.no_grad():
                got = layer(x).float()
            bias = None if layer.bias is None else layer.bias.float()
            want = F.linear(x.float(), w, bias)
            err = (got - want).abs().max().item()
            assert err <= tol * want.abs().max().item(), (layer, rows, err)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [len(o.token_ids) for o in outs] == [10] * len(PROMPTS)
    return layers


def _llm(folder) -> LLM:
    return LLM(str(folder), device="cuda", dtype="bfloat16", max_model_len=128, num_kv_blocks=40)


@pytest.mark.parametrize("case", list(CHECKPOINTS))
def test_awq_and_gptq_projections_on_the_gpu(case, tiny_llama, tmp_path):
    write_checkpoint(tiny_llama, tmp_path / case, CHECKPOINTS[case])
    _check_projections(_llm(tmp_path / case), tol=2e-2)


@pytest.mark.parametrize("scheme", ["w4a16-asym-group", "w8a16-sym-channel", "fp8-channel",
                                    "fp8-block"])  # fmt: skip
def test_compressed_and_fp8_projections_on_the_gpu(scheme, tiny_llama, wide_llama, tmp_path):
    pytest.importorskip("compressed_tensors")
    from tests.support.compressed_checkpoints import SCHEMES, save_compressed

    source = wide_llama if scheme.startswith("fp8") else tiny_llama
    folder = save_compressed(source, tmp_path / scheme, *SCHEMES[scheme])
    fp8 = scheme.startswith("fp8")
    layers = _check_projections(_llm(folder), tol=2**-4 if fp8 else 2e-2)
    if scheme == "fp8-channel" and torch.cuda.get_device_capability() >= (8, 9):
        assert all(layer.kernels.scaled_mm for layer in layers)  # the W8A8 path was kept
