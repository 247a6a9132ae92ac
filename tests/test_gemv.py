"""The split-K batch-1 GEMV against F.linear: small shapes under Triton's CPU interpreter,
Llama-3-8B shapes on a GPU (with the measured choice against cuBLAS,
engine/startup/kernel_choices.py, and a CUDA-graph replay)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.layers import Linear
from engine.startup.kernel_choices import (
    KernelChoices,
    choose_batch1_linears,
    choose_gemv_configs,
    gemv_key,
)
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

DEVICE = "cuda" if HAS_CUDA else "cpu"
(_gemv_mod,) = import_kernel_modules([("gemv", "_gemv_kernel")])


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _case(n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


# (N, K, config, num_sms): split_k 1 and > 1, N not a multiple of BLOCK_N, K of BLOCK_K
@pytest.mark.parametrize(
    "n,k,config,sms",
    [(40, 256, (8, 64, 4), 1), (33, 1000, (16, 64, 4), 8), (7, 512, (4, 128, 4), 64)],
)
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_matches_linear(n, k, config, sms, bias):
    x, w, b = _case(n, k, torch.float32, bias)
    got = _gemv_mod.gemv(x, w, b, config, num_sms=sms)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_split_k_gives_enough_programs_and_whole_tiles():
    split = _gemv_mod.split_k_for(4096, 14336, 32, 256, 132)  # down_proj, H200: 128 row tiles
    assert split > 1 and 4096 // 32 * split >= 2 * 132
    assert _gemv_mod.split_k_for(4096, 14336, 8, 512, 132) == 1  # 512 row tiles suffice
    assert _gemv_mod.split_k_for(128256, 4096, 8, 512, 132) == 1  # lm_head: rows suffice
    assert _gemv_mod.split_k_for(64, 256, 8, 512, 132) == 1  # too short to split


def test_gemv_rejects_bad_inputs():
    x, w, _ = _case(16, 64, torch.float32, False)
    with pytest.raises(ValueError, match=r"x must be \[1, K\]"):
        _gemv_mod.gemv(x.repeat(2, 1), w)
    with pytest.raises(ValueError, match="does not match"):
        _gemv_mod.gemv(x[:, :32], w)
    with pytest.raises(ValueError, match="unit-stride"):
        _gemv_mod.gemv(x, w.t().contiguous().t())


def test_linear_on_cpu_is_plain_linear():
    layer = Linear(64, 32)
    x = torch.randn(1, 64)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    choices = KernelChoices()
    choose_batch1_linears(torch.nn.ModuleList([layer]), choices)
    assert not choices.gemv and layer.gemv_config is None  # nothing timed off CUDA


LLAMA3_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", LLAMA3_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemv_llama3_shapes_gpu(n, k, dtype):
    x, w, b = _case(n, k, dtype, False)
    ref = F.linear(x.float(), w.float())
    for config in _gemv_mod.CONFIGS:
        got = _gemv_mod.gemv(x, w, b, config)
        torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
    choices = KernelChoices()
    choose_gemv_configs([(w, b)], choices)  # timed against cuBLAS
    choice = choices.gemv[gemv_key(w, b)]
    assert choice in [None, *_gemv_mod.CONFIGS]
    print(f"gemv {n}x{k} {dtype}: {'cuBLAS' if choice is None else choice}")


@pytest.mark.gpu
def test_linear_with_gemv_replays_in_a_cuda_graph():
    layer = Linear(4096, 14336, bias=False).to(DEVICE, torch.bfloat16)
    layer.gemv_config = _gemv_mod.CONFIGS[0]  # the Triton GEMV, whatever timing would keep
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device=DEVICE)
    expected = layer(x).clone()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out.float(), F.linear(x, layer.weight).float(), rtol=2e-2, atol=2e-2)
    assert not torch.equal(out, expected)


@pytest.mark.gpu
def test_choice_is_made_per_shape_over_all_weights_before_capture():
    layers = [Linear(1024, 3072, bias=False) for _ in range(4)] + [Linear(1024, 512, bias=True)]
    model = torch.nn.ModuleList(layers).to(DEVICE, torch.bfloat16)
    choices = KernelChoices()
    choose_batch1_linears(model, choices)
    assert not choices.gemv_silu and all(m.silu_config is None for m in layers)
    assert len(choices.gemv) == 2  # one choice per shape
    for layer in layers:
        key = gemv_key(layer.weight, layer.bias)
        assert key in choices.gemv and choices.gemv[key] in [None, *_gemv_mod.CONFIGS]
        assert layer.gemv_config == choices.gemv[key]
    x = torch.randn(1, 1024, dtype=torch.bfloat16, device=DEVICE)
    for layer in layers:
        ref = F.linear(
            x.float(), layer.weight.float(), layer.bias.float() if layer.bias is not None else None
        )
        torch.testing.assert_close(layer(x).float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_silu_mul_matches_the_two_steps(dtype, bias):
    x, w, b = _case(2 * 24, 128, dtype, bias, seed=3)
    got = _gemv_mod.gemv_silu_mul(x, w, b, (8, 64, 4), num_sms=1)
    gate_up = F.linear(x.float(), w.float(), b.float() if bias else None).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up  # rounds to dtype where the kernel rounds
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got, expected, **tol)
    x, w, b = _case(2 * 24, 1024, dtype, bias, seed=3)  # few rows, long K: split-K's case
    assert _gemv_mod.gemv_silu_mul(x, w, b, (8, 64, 4), num_sms=64) is None


@pytest.mark.gpu
def test_gate_up_projection_times_the_fused_form_and_matches_the_two_steps():
    from engine.kernels.silu_mul import silu_and_mul

    model = torch.nn.ModuleDict({"gate_up_proj": Linear(4096, 2 * 14336, bias=False)})
    model = model.to(DEVICE, torch.bfloat16)
    choices = KernelChoices()
    choose_batch1_linears(model, choices)
    layer = model["gate_up_proj"]
    key = gemv_key(layer.weight, None)
    print(f"gate_up: {choices.gemv[key]}, fused: {choices.gemv_silu.get(key)}")
    assert key in choices.gemv_silu
    assert choices.gemv_silu[key] in [None, *_gemv_mod.FUSED_CONFIGS]
    assert layer.silu_config == choices.gemv_silu[key]
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device=DEVICE)
    expected = silu_and_mul(F.linear(x, layer.weight))
    fused = layer.fused_silu_mul(x)  # None where the two steps won
    assert (fused is None) == (layer.silu_config is None)
    got = fused if fused is not None else silu_and_mul(layer(x))
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
