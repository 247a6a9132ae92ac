"""The one-pass Triton dequantization for batched quantized linears (engine/kernels/dequant.py)
against dequantize_to (engine/quant/reference.py), bit for bit: small shapes under Triton's CPU
interpreter (ragged rows and columns, every int8 value, every 4-bit code, NF4 and FP4), its
routing (engine/quant/dispatch.py) and start-up choice (engine/quant/quant_choices.py), and on a GPU
the choice and a batched QuantLinear."""

from __future__ import annotations

import pytest
import torch

from engine.quant.dispatch import dequantized
from engine.quant.quant_choices import QuantChoices, choose_dequant, dequant_key
from engine.quant.reference import dequantize_to, wq_matmul_ref
from engine.quant.weight_format import QuantizedWeight
from tests.support.quant_weights import random_quant_weight
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

(_dequant,) = import_kernel_modules([("dequant", "_dequant_kernel")])
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _layer(kind: str, n: int, k: int, group: int, quant_type: str = "nf4"):
    q, s, code, _ = random_quant_weight(kind, n, k, group, DEVICE, quant_type)
    return q, s, code, group


# kind, N, K, group, quant type: N and K not multiples of the 16 x 256 tile
CASES = [
    ("int8", 40, 300, 0, None),
    ("int8", 16, 512, 0, None),
    ("int4", 33, 320, 64, "nf4"),
    ("int4", 17, 96, 32, "fp4"),
    ("int4", 16, 512, 128, "nf4"),
]


@pytest.mark.parametrize("kind,n,k,group,quant_type", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dequantize_equals_dequantize_to(kind, n, k, group, quant_type, dtype):
    q, s, code, group = _layer(kind, n, k, group, quant_type or "nf4")
    got = _dequant.dequantize(q, s, code, group, dtype)
    want = dequantize_to(q, s, code, group, dtype)
    assert got.shape == want.shape == (n, k) and got.dtype == dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind,n,k,group,quant_type", CASES[:3])
def test_dequantize_bf16_within_one_rounding(kind, n, k, group, quant_type):
    """bf16: bit for bit on a GPU (the GPU test below); Triton's CPU interpreter rounds its
    fp32 -> bf16 casts its own way, so here within one bf16 step (2^-7 of the value)."""
    q, s, code, group = _layer(kind, n, k, group, quant_type or "nf4")
    got = _dequant.dequantize(q, s, code, group, torch.bfloat16).float()
    want = dequantize_to(q, s, code, group, torch.float32)
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-30)


def test_supports_what_it_reads():
    q4, s4 = torch.zeros(4, 48, dtype=torch.uint8), torch.zeros(4, 3)
    assert _dequant.supports(q4, s4, 32)
    assert not _dequant.supports(q4, s4, 36)  # the group does not divide K = 96
    assert not _dequant.supports(q4, s4, 3)  # odd: a byte's two codes would split
    assert not _dequant.supports(q4.t(), s4, 32)  # not unit stride along K
    assert _dequant.supports(torch.zeros(4, 8, dtype=torch.int8), torch.zeros(4), 0)
    assert not _dequant.supports(torch.zeros(4, 8, dtype=torch.int16), torch.zeros(4), 0)


def test_dequantized_takes_the_kernel_only_where_chosen(monkeypatch):
    q, s, code, group = _layer("int4", 16, 128, 64)
    w = QuantizedWeight(q, s, code, None, group)
    calls = []

    def spy(*args):
        calls.append(args)
        return dequantize_to(*args)

    monkeypatch.setattr(_dequant, "dequantize", spy)
    want = dequantize_to(q, s, code, group, torch.float16)
    assert torch.equal(dequantized(w, torch.float16, by_kernel=False), want)
    assert not calls  # not chosen: dequantize_to
    assert torch.equal(dequantized(w, torch.float16, by_kernel=True), want)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "ours_seconds,wrong,fails,kept",
    [
        (1.0, False, False, True),
        (3.0, False, False, False),
        (1.0, True, False, False),
        (1.0, False, True, False),
    ],
)
def test_choose_keeps_the_kernel_only_when_equal_and_faster(
    monkeypatch, ours_seconds, wrong, fails, kept
):
    """choose_dequant's decision, with the device timing replaced by fixed times (PyTorch's:
    2 s): kept only when its bits equal dequantize_to's and it is faster; a wrong bit, or a
    device that cannot run it (Triton's OutOfResources), keeps dequantize_to."""
    from triton.runtime.errors import OutOfResources

    import engine.timing as timing

    q, s, code, group = _layer("int4", 16, 128, 64)
    real = _dequant.dequantize
    calls = []

    def ours(*args):
        calls.append(1)
        if fails:
            raise OutOfResources(300_000, 232_448, "shared memory")
        out = real(*args)
        return out.flatten().index_fill(0, torch.tensor([3]), 0.5).view_as(out) if wrong else out

    def seconds(fn):  # graph_seconds: the kernel's time where it ran, else PyTorch's
        calls.clear()
        fn()
        return ours_seconds if calls else 2.0

    monkeypatch.setattr(_dequant, "dequantize", ours)
    monkeypatch.setattr(timing, "graph_seconds", seconds)
    choices = QuantChoices()
    w = QuantizedWeight(q, s, code, None, group)
    choose_dequant([w, w], choices, torch.float16)
    assert choices.dequant == {dequant_key(w, torch.float16): kept}


def test_choose_lets_an_unexpected_error_through(monkeypatch):
    def broken(*args):
        raise RuntimeError("a bug in the kernel")

    monkeypatch.setattr(_dequant, "dequantize", broken)
    w = QuantizedWeight(*_layer("int4", 16, 128, 64)[:3], None, 64)
    with pytest.raises(RuntimeError, match="a bug in the kernel"):
        choose_dequant([w], QuantChoices(), torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_choice_and_batched_linear_gpu(kind, monkeypatch):
    """On Llama-3-8B's gate_up shape: bf16 bit for bit, the start-up choice made (either way)
    and logged, and a 64-row QuantLinear equal to the reference whichever way it dequantizes
    (no GEMM chosen: 64 rows dequantize)."""
    from engine.quant.modules import QuantLinear
    from engine.quant.weight_format import WeightQuant

    q, s, code, group = _layer(kind, 28672, 4096, 64)
    dtype = torch.bfloat16
    assert torch.equal(
        _dequant.dequantize(q, s, code, group, dtype), dequantize_to(q, s, code, group, dtype)
    )
    w = QuantizedWeight(q, s, code, None, group)
    choices = QuantChoices()
    choose_dequant([w, w], choices, dtype)
    key = dequant_key(w, dtype)
    assert key in choices.dequant
    linear = QuantLinear(4096, 28672, False, WeightQuant(kind, group_size=64), dtype, "cuda")
    linear.qweight.copy_(q)
    linear.scales.copy_(s)
    if code is not None:
        linear.code.copy_(code)
    linear.kernels = choices.kernels_for(linear.quantized, dtype)
    assert linear.kernels.dequant == choices.dequant[key] and not linear.kernels.gemm
    x = torch.randn(64, 4096, dtype=dtype, device="cuda")
    torch.testing.assert_close(linear(x), wq_matmul_ref(x, q, s, code, None, group), rtol=0, atol=0)
    print(f"{kind} gate_up: Triton dequantization {'kept' if choices.dequant[key] else 'not kept'}")
