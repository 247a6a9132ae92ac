"""The batch-1 split-K GEMV for int8 / int4 weights (engine/kernels/wq_gemv.py) against the
PyTorch reference: small shapes under Triton's CPU interpreter (split 1 and > 1, ragged N, bias,
every int8 value, every 4-bit code), Llama-3-8B shapes and the measured choice on a GPU."""

from __future__ import annotations

import pytest
import torch

from engine.quant.dispatch import QuantKernels, fused_silu, quant_linear
from engine.quant.quant_choices import QuantChoices, choose_gemv, choose_gemv_silu
from engine.quant.reference import wq_matmul_ref
from engine.quant.weight_format import QuantizedWeight
from tests.support.quant_weights import random_quant_weight
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

(_gemv, _wq_matmul, _wq_gemv) = import_kernel_modules(
    [("gemv", "_gemv_kernel"), ("wq_matmul", "_wq_matmul_kernel"), ("wq_gemv", "_wq_gemv_kernel")]
)

DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _layer(kind: str, n: int, k: int, group: int, bias: bool, dtype, seed: int = 0):
    q, s, code, g = random_quant_weight(kind, n, k, group, DEVICE, seed=seed)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    x = torch.randn(1, k, generator=g).to(dtype).to(DEVICE)
    return x, (q, s, code, b, group)


# kind, N, K, group, config, num_sms: split 1 and > 1, N not a multiple of BLOCK_N
CASES = [
    ("int8", 40, 256, 0, (16, 64, 4), 1),
    ("int8", 33, 1024, 0, (8, 64, 4), 16),
    ("int4", 40, 256, 64, (16, 0, 4), 1),
    ("int4", 33, 1024, 32, (8, 0, 4), 16),
    ("int4", 20, 512, 128, (16, 0, 2), 64),
    # int4 words, to fp32 and in the dot form (CUDA, where fp32 x takes the fp32 words;
    # the table path here)
    ("int4", 24, 512, 64, (8, 1, 4), 8),
    ("int4", 24, 512, 64, (8, 2, 4), 8),
    ("int4", 24, 512, 64, (8, 2, 4, 96), 8),  # a register cap (ptxas .maxnreg) on CUDA
]


@pytest.mark.parametrize("kind,n,k,group,config,sms", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_splitk_matches_reference(kind, n, k, group, config, sms, bias):
    """fp32 x, so only the sums' order separates kernel and reference. The int4 word paths
    (CUDA, second config field >= 1; fp32 x takes the fp32 form) hold the code table in fp16
    (ptx_decode.py): their reference uses that rounded table."""
    x, layer = _layer(kind, n, k, group, bias, torch.float32)
    got = _wq_gemv.wq_gemv(x, *layer, config, num_sms=sms)
    q, s, code, b, group = layer
    if kind == "int4" and config[1] >= 1 and x.is_cuda:
        code = code.half().float()
    torch.testing.assert_close(got, wq_matmul_ref(x, q, s, code, b, group), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config,sms", [((8, 2, 4), 8), ((128, 2, 8), 132), ((64, 2, 2), 1)])
def test_int4_dot_form_within_its_rounding_gpu(dtype, config, sms):
    """The int4 dot form sums a word's eight products in x's 16-bit type (two lanes of four):
    against the reference with the table in that type, each output is within four 16-bit
    rounding steps of the sum of |products|, plus the output's own rounding; the fp32-word
    form (second field 1) is held to the same bound, as a check the bound is not loose."""
    x, layer = _layer("int4", 200, 2048, 64, True, dtype, seed=3)
    q, s, code, b, group = layer
    got = _wq_gemv.wq_gemv(x, *layer, config, num_sms=sms).float()
    table = code.to(dtype).float()
    ref = wq_matmul_ref(x.float(), q, s, table, b.float(), group)
    size = wq_matmul_ref(x.float().abs(), q, s, table.abs(), None, group)  # sum of |products|
    step = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    bound = 4 * step * size + step * ref.abs() + 1e-6
    assert ((got - ref).abs() <= bound).all(), ((got - ref).abs() / bound).max()
    words = _wq_gemv.wq_gemv(x, *layer, (config[0], 1, config[2]), num_sms=sms).float()
    assert ((words - ref).abs() <= bound).all()
    assert not torch.equal(got, words)  # the two forms round differently: both ran


@pytest.mark.gpu
@pytest.mark.parametrize("kind,n,k,group,config,sms", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_splitk_matches_reference_gpu(kind, n, k, group, config, sms, bias):
    """The same cases on the GPU, where int8 takes the inline-PTX word path (every int8 value
    is in the first row) and the kernels launch with PDL on Hopper."""
    test_splitk_matches_reference(kind, n, k, group, config, sms, bias)


# kind, I (outputs: the weight has 2I rows), K, group, config: I not a multiple of BLOCK_N / 2
SILU_CASES = [
    ("int8", 20, 256, 0, (16, 64, 4)),
    ("int8", 9, 128, 0, (2, 64, 1)),
    ("int4", 33, 256, 64, (8, 0, 4)),
]


@pytest.mark.parametrize("kind,i,k,group,config", SILU_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_fused_matches_the_two_steps(kind, i, k, group, config, bias, dtype):
    """wq_gemv_silu against the reference GEMV rounded to x's dtype, then the silu-mul kernel
    (which rounds where the fused epilogue does): equal within one 16-bit rounding step (the
    sums' order differs; the interpreter's own GEMV cast truncates, so it is not the
    reference here)."""
    from engine.kernels.silu_mul import silu_and_mul

    x, layer = _layer(kind, 2 * i, k, group, bias, dtype)
    got = _wq_gemv.wq_gemv_silu(x, *layer, config, num_sms=1)
    q, s, code, b, group = layer
    fp32_bias = b.float() if b is not None else None
    want = silu_and_mul(wq_matmul_ref(x.float(), q, s, code, fp32_bias, group).to(dtype))
    assert got.shape == (1, i) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())


def test_silu_fused_declines_what_needs_split_k():
    x, layer = _layer("int8", 8, 4096, 0, False, torch.float32)
    assert _wq_gemv.wq_gemv_silu(x, *layer, (2, 64, 1), num_sms=64) is None  # 8 programs


def test_only_power_of_two_int4_groups_take_the_splitk_kernel(monkeypatch):
    x = torch.randn(1, 96)
    q4 = torch.zeros(4, 48, dtype=torch.uint8)
    assert _wq_gemv.supports(q4, x, 32) and not _wq_gemv.supports(q4, x, 48)
    assert not _wq_gemv.supports(q4, x, 8)
    assert _wq_gemv.supports(torch.zeros(4, 96, dtype=torch.int8), x, 0)
    assert not _wq_gemv.supports(q4, torch.randn(2, 96), 32)  # one row only
    # off CUDA the reference serves one row, even with a config chosen for the shape
    w = QuantizedWeight(q4, torch.rand(4, 3), torch.linspace(-1, 1, 16), None, 32)
    calls = []
    monkeypatch.setattr(_wq_gemv, "wq_gemv", lambda *a: calls.append(a))
    got = quant_linear(x, w, QuantKernels(torch.float32, gemv=(16, 0, 4)))
    assert not calls and torch.equal(got, wq_matmul_ref(x, *w.kernel_args()))


LLAMA3_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("n,k", LLAMA3_SHAPES)
def test_splitk_llama3_shapes_gpu(kind, n, k):
    x, layer = _layer(kind, n, k, 64, False, torch.bfloat16)
    ref = wq_matmul_ref(x.float(), *layer[:3], None, 64)
    for config in _wq_gemv.CONFIGS[kind]:
        got = _wq_gemv.wq_gemv(x, *layer, config)
        torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=5e-2 * ref.abs().max())
    w = QuantizedWeight(*layer)
    choices = QuantChoices()
    choose_gemv([w], choices, x.dtype)  # timed against the other configs
    kernels = choices.kernels_for(w, x.dtype)
    assert kernels.gemv in _wq_gemv.CONFIGS[kind]
    got = quant_linear(x, w, kernels)  # the engine's path: the split-K kernel at that config
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=5e-2 * ref.abs().max())
    print(f"{kind} {n}x{k}: {kernels.gemv}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_silu_choice_on_llama3_gate_up_gpu(kind):
    """choose_gemv_silu times the fused kernel against the two steps on the real gate_up shape;
    the path it keeps, and the fused kernel at the GEMV's config whether kept or not, give
    silu(gate) * up."""
    from engine.kernels.silu_mul import silu_and_mul

    weights = [
        QuantizedWeight(*_layer(kind, 28672, 4096, 64, False, torch.bfloat16, seed)[1])
        for seed in (0, 1)
    ]
    x = _layer(kind, 28672, 4096, 64, False, torch.bfloat16)[0]
    choices = QuantChoices()
    choose_gemv_silu(weights, choices, torch.bfloat16)
    kernels = choices.kernels_for(weights[0], torch.bfloat16)
    assert kernels.gemv in _wq_gemv.CONFIGS[kind]
    ref = silu_and_mul(wq_matmul_ref(x.float(), *weights[0].kernel_args()).to(torch.bfloat16))
    tol = dict(rtol=2e-2, atol=5e-2 * ref.abs().max().item())
    fused = fused_silu(x, weights[0], kernels)  # None where the two steps won
    assert (fused is None) == (kernels.gemv_silu is None)
    kept = fused if fused is not None else silu_and_mul(quant_linear(x, weights[0], kernels))
    torch.testing.assert_close(kept.float(), ref.float(), **tol)
    # the fused kernel on the real shape, at the GEMV's config, whether kept or not: sized as
    # for one SM it never splits K (on the H200 every int4 config needs a split on 132 SMs, so
    # the fused form is never kept there)
    forced = _wq_gemv.wq_gemv_silu(x, *weights[0].kernel_args(), kernels.gemv, num_sms=1)
    assert forced is not None
    torch.testing.assert_close(forced.float(), ref.float(), **tol)
    print(f"{kind} gate_up silu: {kernels.gemv_silu or 'two steps'}")
