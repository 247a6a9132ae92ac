"""The row-count table of engine/quant/dispatch.py: which kernel serves 1, 2-16, 17-256 and more
rows, with the start-up choices made and with none, each matching the reference. Without a
GPU, Triton's CPU interpreter stands in for CUDA (dispatch.kernels_run_on answers yes)."""

from __future__ import annotations

import pytest
import torch

from engine.quant import dispatch
from engine.quant.dispatch import QuantKernels, fused_silu, quant_linear
from engine.quant.reference import wq_matmul_ref
from engine.quant.weight_format import QuantizedWeight
from tests.support.quant_weights import random_quant_weight
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

(_dequant, _wq_matmul, _wq_gemv, _gemm) = import_kernel_modules(
    [
        ("dequant", "_dequant_kernel"),
        ("wq_matmul", "_wq_matmul_kernel"),
        ("wq_gemv", "_wq_gemv_kernel"),
        ("wq_gemm", "_wq_gemm_kernel"),
    ]
)
DEVICE = "cuda" if HAS_CUDA else "cpu"
GEMV = (16, 0, 4)  # BLOCK_N, int4's table loads, warps
GEMM = (16, 16, 1, 4, 1, 0)  # BLOCK_N, BLOCK_M, one group a step, warps, stages, ahead
CHOSEN = QuantKernels(
    torch.float16, gemv=GEMV, gemv_silu=GEMV, dequant=True, gemm=dict.fromkeys(_gemm.BUCKETS, GEMM)
)
NONE = QuantKernels(torch.float16)
# rows -> (the kernel serving them with CHOSEN, with NONE); "torch": dequantize_to + cuBLAS
TABLE = {
    1: ("wq_gemv", "wq_matmul"),
    2: ("wq_gemm", "wq_matmul"),
    16: ("wq_gemm", "wq_matmul"),
    17: ("wq_gemm", "torch"),
    256: ("wq_gemm", "torch"),
    257: ("dequantize", "torch"),
}


@pytest.fixture(autouse=True)
def _kernels_on_the_cpu(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setattr(dispatch, "kernels_run_on", lambda x: True)


@pytest.fixture
def ran(monkeypatch) -> list[str]:
    """The names of the kernels called, in order."""
    names = []

    def spy(real, name):
        return lambda *args, **kw: names.append(name) or real(*args, **kw)

    for module, name in [
        (_dequant, "dequantize"),
        (_wq_matmul, "wq_matmul"),
        (_wq_gemv, "wq_gemv"),
        (_wq_gemv, "wq_gemv_silu"),
        (_gemm, "wq_gemm"),
    ]:
        monkeypatch.setattr(module, name, spy(getattr(module, name), name))
    return names


def _weight() -> QuantizedWeight:
    q, s, code, g = random_quant_weight("int4", 24, 128, 64, DEVICE)
    bias = (torch.randn(24, generator=g) / 4).to(DEVICE, torch.float16)
    return QuantizedWeight(q, s, code, bias, 64)


@pytest.mark.parametrize("rows", list(TABLE))
@pytest.mark.parametrize("chosen", [True, False], ids=["chosen", "nothing-timed"])
def test_each_row_count_takes_its_path(rows, chosen, ran):
    w = _weight()
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    x = x.to(DEVICE, torch.float16)
    got = quant_linear(x, w, CHOSEN if chosen else NONE)
    want_path = TABLE[rows][0 if chosen else 1]
    assert ran == ([] if want_path == "torch" else [want_path])
    want = wq_matmul_ref(x, *w.kernel_args()).float()
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=4e-3 * scale)


def test_choices_for_another_dtype_are_not_used(ran):
    w = _weight()
    x = torch.randn(1, 128).to(DEVICE, torch.bfloat16)
    quant_linear(x, w, CHOSEN)  # timed for fp16 activations
    assert ran == ["wq_matmul"]


def test_the_fused_silu_form_serves_one_row_where_chosen(ran):
    w = _weight()
    x = torch.randn(1, 128).to(DEVICE, torch.float16)
    assert fused_silu(x, w, NONE) is None and fused_silu(x.repeat(2, 1), w, CHOSEN) is None
    assert not ran
    out = fused_silu(x, w, CHOSEN)
    assert ran == ["wq_gemv_silu"] and out.shape == (1, 12)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", list(TABLE))
@pytest.mark.parametrize("chosen", [True, False], ids=["chosen", "nothing-timed"])
def test_each_row_count_takes_its_path_gpu(rows, chosen, ran):
    """The same table on the GPU, compiled kernels and cuBLAS."""
    test_each_row_count_takes_its_path(rows, chosen, ran)
