"""INT8 / INT4 weight-only linear layers: bitsandbytes' quantization in our layout, the PyTorch
reference against bitsandbytes' own dequantization and the float weight, and the Triton
kernel (CPU interpreter; Llama-3-8B layer shapes on a GPU) against the reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.quant.bnb import code_table, quantize_4bit, quantize_int8
from engine.quant.modules import QuantLinear
from engine.quant.reference import dequantize_ref, dequantize_to, wq_matmul_ref
from engine.quant.weight_format import WeightQuant
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

# Kernel modules first: bitsandbytes imports triton, which must see TRITON_INTERPRET first.
(_wq,) = import_kernel_modules([("wq_matmul", "_wq_matmul_kernel")])
bnb_f = pytest.importorskip("bitsandbytes.functional")
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _quantized(kind: str, n: int, k: int, gen, group: int = 64, device: str = "cpu"):
    w = torch.randn(n, k, generator=gen).to(device)
    if kind == "int8":
        return w, *quantize_int8(w), None
    return w, *quantize_4bit(w, group, "nf4"), code_table("nf4").to(device)


def test_reference_matches_bitsandbytes_dequantization():
    gen = torch.Generator().manual_seed(0)
    w, q, s, _ = _quantized("int8", 24, 96, gen)
    # LLM.int8's rows: W ~ q * absmax / 127, each weight within half a step of the original.
    assert torch.allclose(dequantize_ref(q, s, None, 0), q.float() * s[:, None])
    assert ((dequantize_ref(q, s, None, 0) - w).abs() <= s[:, None] / 2 + 1e-6).all()
    w, q, s, code = _quantized("int4", 24, 128, gen, group=32)
    _, state = bnb_f.quantize_4bit(w, blocksize=32, quant_type="nf4")
    expected = bnb_f.dequantize_4bit(q.view(-1, 1), state)
    assert torch.equal(dequantize_ref(q, s, code, 32), expected)
    # NF4 over 32-weight groups: errors stay a fraction of the group's absmax.
    err = (dequantize_ref(q, s, code, 32) - w).abs().view(24, 4, 32).amax(-1)
    assert (err <= 0.16 * s).all()


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quant_linear_tracks_the_float_layer(kind):
    torch.manual_seed(0)
    linear = nn.Linear(128, 48, bias=True)
    layer = QuantLinear.from_linear(linear, WeightQuant(kind, group_size=64))
    x = torch.randn(5, 128)
    expected = x @ layer.dequantize().T + linear.bias
    with torch.no_grad():
        out = layer(x)
        exact = linear(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    rel = ((out - exact).norm() / exact.norm()).item()
    assert rel < (0.02 if kind == "int8" else 0.15), rel
    assert layer.qweight.numel() * layer.qweight.element_size() == 128 * 48 // (
        1 if kind == "int8" else 2
    )


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("m", [1, 3, 20])
def test_kernel_matches_reference(kind, m):
    gen = torch.Generator().manual_seed(m)
    _, q, s, code = _quantized(kind, 40, 192, gen, device=DEVICE)
    x = torch.randn(m, 192, generator=gen).to(DEVICE)
    bias = torch.randn(40, generator=gen).to(DEVICE)
    out = _wq.wq_matmul(x, q, s, code, bias, 64)
    torch.testing.assert_close(out, wq_matmul_ref(x, q, s, code, bias, 64), rtol=1e-4, atol=1e-4)


def test_kernel_rejects_bad_inputs():
    gen = torch.Generator().manual_seed(0)
    _, q, s, code = _quantized("int4", 16, 128, gen, device=DEVICE)
    x = torch.randn(2, 128, device=DEVICE)
    with pytest.raises(ValueError, match="features"):
        _wq.wq_matmul(x[:, :64], q, s, code)
    with pytest.raises(ValueError, match="code"):
        _wq.wq_matmul(x, q, s, None)
    with pytest.raises(ValueError, match="scales"):
        _wq.wq_matmul(x, q, s.half(), code)
    with pytest.raises(ValueError, match="x must be"):
        _wq.wq_matmul(x.to(torch.int32), q, s, code)


# ------------------------------------------------------------------- GPU: real shapes

LLAMA3_8B_LAYERS = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("k,n", LLAMA3_8B_LAYERS)
def test_kernel_llama3_shapes_gpu(kind, dtype, k, n):
    gen = torch.Generator().manual_seed(k + n)
    _, q, s, code = _quantized(kind, n, k, gen, device="cuda")
    w = dequantize_ref(q, s, code, 64).to(dtype)
    for m in (1, 2, 5, 16, 64):
        x = torch.randn(m, k, generator=gen).to("cuda", dtype)
        out = _wq.wq_matmul(x, q, s, code, None, 64)
        ref = x.float() @ w.float().T
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-2, (m, err)


@pytest.mark.gpu
def test_kernel_replays_in_a_cuda_graph():
    gen = torch.Generator().manual_seed(0)
    _, q, s, code = _quantized("int4", 4096, 4096, gen, device="cuda")
    x = torch.randn(1, 4096, generator=gen).to("cuda", torch.bfloat16)
    expected = _wq.wq_matmul(x, q, s, code)  # tunes outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _wq.wq_matmul(x, q, s, code)
    x.copy_(torch.randn(1, 4096, generator=gen).to("cuda", torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(out, expected)
    torch.testing.assert_close(out, _wq.wq_matmul(x, q, s, code))


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_to_equals_the_fp32_reference_rounded(kind, dtype):
    gen = torch.Generator().manual_seed(5)
    _, q, s, code = _quantized(kind, 48, 256, gen)
    expected = dequantize_ref(q, s, code, 64).to(dtype)
    got = dequantize_to(q, s, code, 64, dtype)
    assert got.dtype == dtype and torch.equal(got, expected)
