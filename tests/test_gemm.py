"""The decode-batch Triton GEMM against F.linear: small ragged shapes under Triton's CPU
interpreter, Llama-3-8B shapes on a GPU (each config, then the measured choice)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.triton_modules import HAS_CUDA, import_kernel_modules

DEVICE = "cuda" if HAS_CUDA else "cpu"
(_norm, _gemv, _decode, _gemm) = import_kernel_modules(
    [
        ("rmsnorm", "_rms_norm_kernel"),
        ("gemv", "_gemv_kernel"),
        ("decode_attention", "_decode_split_kernel"),
        ("gemm", "_gemm_kernel"),
    ]
)


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _case(m, n, k, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


# M, N, K not multiples of the tiles; one config per tile shape
@pytest.mark.parametrize("m,n,k", [(3, 40, 96), (17, 33, 200), (40, 70, 64)])
@pytest.mark.parametrize("config", [(16, 16, 32, 4, 2), (32, 64, 64, 4, 2)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_matches_linear(m, n, k, config, bias):
    x, w, b = _case(m, n, k, torch.float32, bias)
    torch.testing.assert_close(_gemm.gemm(x, w, b, config), F.linear(x, w, b), rtol=1e-4, atol=1e-4)


def test_gemm_rounds_16_bit_outputs_like_linear():
    x, w, b = _case(5, 24, 64, torch.bfloat16, True)
    got = _gemm.gemm(x, w, b, (16, 16, 32, 4, 2))
    ref = F.linear(x.float(), w.float(), b.float()).to(torch.bfloat16)
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)


def test_buckets_and_rejections():
    assert [_gemm.bucket(m) for m in (1, 2, 16, 17, 200, 256, 257)] == [
        16,
        16,
        16,
        32,
        256,
        256,
        None,
    ]
    x, w, _ = _case(4, 8, 32, torch.float32, False)
    assert _gemm.gemm_config(w, None, 4) is None  # nothing chosen off the device
    with pytest.raises(ValueError, match="does not match"):
        _gemm.gemm(x[:, :16], w, None, _gemm.CONFIGS[0])
    with pytest.raises(ValueError, match="share a float dtype"):
        _gemm.gemm(x.half(), w, None, _gemm.CONFIGS[0])


LLAMA3_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("n,k", LLAMA3_SHAPES)
def test_gemm_llama3_shapes_gpu(n, k):
    x, w, _ = _case(256, n, k, torch.bfloat16, False)
    ref = F.linear(x.float(), w.float())
    for config in _gemm.CONFIGS:
        torch.testing.assert_close(
            _gemm.gemm(x, w, None, config).float(), ref, rtol=2e-2, atol=2e-2
        )
    _gemm.choose_configs([(w, None)])
    print(f"gemm {n}x{k}:", {r: _gemm.gemm_config(w, None, r) for r in _gemm.BUCKETS})
