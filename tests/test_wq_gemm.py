"""The dequantizing GEMM for decode batches (engine/kernels/wq_gemm.py) against the
dequantize-then-matmul reference: ragged shapes under Triton's CPU interpreter (int8, NF4,
FP4, bias, split K), its routing (engine/quant/dispatch.py) and start-up choice
(engine/quant/quant_choices.py), and on a GPU every config on Llama-3-8B's shapes and a batched
QuantLinear through the choice."""

from __future__ import annotations

import pytest
import torch

from engine.quant import dispatch
from engine.quant.dispatch import QuantKernels, quant_linear
from engine.quant.quant_choices import QuantChoices, choose_gemm, layer_key
from engine.quant.reference import wq_matmul_ref
from engine.quant.weight_format import QuantizedWeight
from tests.support.quant_weights import random_quant_weight
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

(_gemm,) = import_kernel_modules([("wq_gemm", "_wq_gemm_kernel")])
DEVICE = "cuda" if HAS_CUDA else "cpu"
SMALL = (16, 16, 32, 4, 1, 0)  # BLOCK_N, BLOCK_M, BLOCK_K (int4: groups), warps, stages, ahead
AHEAD = (16, 16, 32, 4, 1, 1)  # the next K-step's tiles loaded before this one's products
GROUPS = (16, 16, 2, 4, 1, 1)  # int4: two scale groups a K-step (int8: 2-wide, never used)


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _layer(kind, n, k, group, quant_type="nf4", bias=False, dtype=torch.float16):
    q, s, code, g = random_quant_weight(kind, n, k, group, DEVICE, quant_type)
    b = (torch.randn(n, generator=g) / 4).to(DEVICE, dtype) if bias else None
    return q, s, code, b, group


def _x(m, k, dtype=torch.float16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(DEVICE, dtype)


def _assert_matches(got, x, layer):
    """Within the output's 16-bit rounding of sums that differ from the reference only in
    order (int4: the same 16-bit weights) or in rounding each int8 x scale (int8)."""
    want = wq_matmul_ref(x, *layer).float()
    assert got.shape == want.shape and got.dtype == x.dtype
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=4e-3 * scale)


# kind, M, N, K, group, quant type, bias, SM count (64 splits K at these sizes, 1 does not)
CASES = [
    ("int8", 17, 40, 300, 0, None, False, 1),
    ("int8", 33, 24, 512, 0, None, True, 64),
    ("int4", 20, 33, 640, 64, "nf4", False, 64),
    ("int4", 17, 17, 256, 32, "fp4", True, 1),
    ("int4", 40, 16, 1024, 128, "nf4", True, 64),
]


@pytest.mark.parametrize("config", [SMALL, AHEAD, GROUPS], ids=["in-step", "ahead", "groups"])
@pytest.mark.parametrize("kind,m,n,k,group,quant_type,bias,sms", CASES)
def test_gemm_matches_reference(kind, m, n, k, group, quant_type, bias, sms, config):
    if kind == "int8" and config is GROUPS:
        pytest.skip("int4 only")
    layer = _layer(kind, n, k, group, quant_type or "nf4", bias)
    x = _x(m, k)
    block_k = group if kind == "int4" else config[2]
    split = _gemm.split_for(m, n, k, config, block_k, sms)
    assert (split > 1) == (sms == 64)  # both the one-pass and the summed-partials epilogues
    _assert_matches(_gemm.wq_gemm(x, *layer, config, num_sms=sms), x, layer)


def test_a_planted_error_fails_the_comparison():
    """The tolerance catches one wrong int4 code: flip a code of the first row."""
    q, s, code, bias, group = _layer("int4", 16, 128, 64)
    x = _x(17, 128)
    bad = q.clone()
    bad[0, 0] ^= 0x70
    got = _gemm.wq_gemm(x, bad, s, code, bias, group, SMALL, num_sms=1)
    with pytest.raises(AssertionError):
        _assert_matches(got, x, (q, s, code, bias, group))


def test_supports_what_it_reads():
    q4, s4 = torch.zeros(4, 64, dtype=torch.uint8), torch.zeros(4, 2)
    x = torch.zeros(32, 128, dtype=torch.float16)
    assert _gemm.supports(q4, s4, x, 64)
    assert not _gemm.supports(q4, s4, x.float(), 64)  # the tensor cores take 16-bit x
    assert not _gemm.supports(q4, s4, torch.zeros(257, 128, dtype=torch.float16), 64)
    assert not _gemm.supports(q4, torch.zeros(4, 8), x, 16)  # a byte half under 16 wide
    assert not _gemm.supports(q4, torch.zeros(4, 4), x[:, :96], 24)  # not a power of two
    assert not _gemm.supports(q4.t(), s4, x, 64)
    assert _gemm.supports(torch.zeros(4, 128, dtype=torch.int8), torch.zeros(4), x, 0)
    assert not _gemm.supports(torch.zeros(4, 96, dtype=torch.int8), torch.zeros(4), x, 0)


def test_bucket_for():
    assert [_gemm.bucket_for(m) for m in (2, 16, 17, 32, 33, 64, 100, 256, 257)] == [
        16,
        16,
        32,
        32,
        64,
        64,
        128,
        256,
        None,
    ]


def test_the_table_runs_the_gemm_only_where_chosen(monkeypatch):
    """dispatch.quant_linear with its kernel paths on (the interpreter stands in for CUDA):
    the GEMM serves a batch only in a row bucket it was chosen for, and only for x's dtype."""
    layer = _layer("int8", 24, 128, 0)
    w = QuantizedWeight(*layer)
    x = _x(20, 128)
    calls = []
    real = _gemm.wq_gemm
    monkeypatch.setattr(_gemm, "wq_gemm", lambda *a: calls.append(a[-1]) or real(*a))
    monkeypatch.setattr(dispatch, "kernels_run_on", lambda x: True)
    _assert_matches(quant_linear(x, w, QuantKernels(torch.float16)), x, layer)
    assert not calls  # nothing chosen: dequantize + matmul
    kernels = QuantKernels(torch.float16, gemm={32: SMALL})
    _assert_matches(quant_linear(x, w, kernels), x, layer)
    assert calls == [SMALL]
    _assert_matches(quant_linear(_x(40, 128), w, kernels), _x(40, 128), layer)
    assert calls == [SMALL]  # bucket 64 was not chosen
    x3 = x.view(4, 5, 128)  # leading dims are kept
    assert quant_linear(x3, w, kernels).shape == (4, 5, 24) and len(calls) == 2
    quant_linear(x.float(), w, kernels)  # chosen for fp16 activations, not fp32
    assert len(calls) == 2


@pytest.mark.parametrize(
    "kernel_seconds,wrong,fails,kept",
    [
        (1.0, False, False, True),
        (3.0, False, False, False),
        (1.0, True, False, False),
        (1.0, False, True, False),
    ],
)
def test_choose_keeps_a_config_only_when_right_and_faster(
    monkeypatch, kernel_seconds, wrong, fails, kept
):
    """choose_gemm with the device timing replaced (dequantize + matmul: 2 s): a config is kept
    only when it matches the reference and is faster; a wrong one, or one this device cannot
    run (Triton's OutOfResources), never is."""
    from triton.runtime.errors import OutOfResources

    import engine.timing as timing

    layer = _layer("int4", 16, 128, 64)
    real = _gemm.wq_gemm

    def kernel(*args, **kw):
        if fails:
            raise OutOfResources(300_000, 232_448, "shared memory")
        out = real(*args, **kw)
        return out * 1.5 if wrong else out

    def seconds(fn):  # graph_seconds, from who runs: the kernel's spy or the reference path
        calls.clear()
        fn()
        return kernel_seconds if calls else 2.0

    calls = []

    def spy(*args, **kw):
        calls.append(1)
        return kernel(*args, **kw)

    monkeypatch.setattr(_gemm, "wq_gemm", spy)
    monkeypatch.setattr(
        _gemm, "CONFIGS", {"int8": {16: [], 32: []}, "int4": {16: [SMALL], 32: [SMALL]}}
    )
    monkeypatch.setattr(timing, "graph_seconds", seconds)
    choices = QuantChoices()
    w = QuantizedWeight(*layer)
    choose_gemm([w, w], choices, torch.float16, max_rows=24)
    chosen = SMALL if kept else None
    assert choices.gemm == {layer_key(w, torch.float16): {16: chosen, 32: chosen}}


def test_choose_lets_an_unexpected_error_through(monkeypatch):
    """An error that is not the device's limit (here a RuntimeError) is the kernel's bug: it
    reaches the caller instead of quietly dropping the config."""
    import engine.timing as timing

    def broken(*args, **kw):
        raise RuntimeError("a bug in the launch")

    monkeypatch.setattr(_gemm, "wq_gemm", broken)
    monkeypatch.setattr(timing, "graph_seconds", lambda fn: fn() or 1.0)
    w = QuantizedWeight(*_layer("int4", 16, 128, 64))
    with pytest.raises(RuntimeError, match="a bug in the launch"):
        choose_gemm([w], QuantChoices(), torch.float16, max_rows=16)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("m", [9, 17, 64, 200])
def test_llama3_shapes_every_config_gpu(kind, m):
    dtype = torch.bfloat16
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]:
        layer = _layer(kind, n, k, 64, dtype=dtype)
        x = _x(m, k, dtype)
        for config in _gemm.CONFIGS[kind][_gemm.bucket_for(m)]:
            _assert_matches(_gemm.wq_gemm(x, *layer, config), x, layer)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_choice_and_batched_linear_gpu(kind, monkeypatch):
    """gate_up at 8, 32 and 64 rows: the choice made for each row bucket is one of its configs
    or the path without the GEMM, a QuantLinear of that many rows runs the GEMM exactly when a
    config was kept (with that config), and matches the reference either way."""
    from engine.quant.modules import QuantLinear
    from engine.quant.weight_format import WeightQuant

    dtype = torch.bfloat16
    q, s, code, _, group = _layer(kind, 28672, 4096, 64, dtype=dtype)
    linear = QuantLinear(4096, 28672, False, WeightQuant(kind, group_size=64), dtype, "cuda")
    linear.qweight.copy_(q)
    linear.scales.copy_(s)
    if code is not None:
        linear.code.copy_(code)
    choices = QuantChoices()
    choose_gemm([linear.quantized] * 4, choices, dtype, max_rows=64)
    linear.kernels = choices.kernels_for(linear.quantized, dtype)
    buckets = choices.gemm[layer_key(linear.quantized, dtype)]
    assert sorted(buckets) == [16, 32, 64]
    calls = []
    real = _gemm.wq_gemm
    monkeypatch.setattr(_gemm, "wq_gemm", lambda *a: calls.append(a[-1]) or real(*a))
    for m in (8, 32, 64):
        chosen = buckets[_gemm.bucket_for(m)]
        assert chosen in [None, *_gemm.CONFIGS[kind][_gemm.bucket_for(m)]]
        x = _x(m, 4096, dtype)
        calls.clear()
        _assert_matches(linear(x), x, (q, s, code, None, group))
        assert calls == ([chosen] if chosen is not None else [])
        print(f"{kind} gate_up {m} rows: {chosen or 'the path without the GEMM'}")

        print(f"{kind} gate_up {m} rows: {chosen or 'the path without the GEMM'}")


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter's stand-in for the PTX decode")
@pytest.mark.parametrize("kind,m,n,k,group,quant_type,bias,sms", CASES[2:])
def test_int4_words_path_in_the_interpreter(
    monkeypatch, kind, m, n, k, group, quant_type, bias, sms
):
    """The int4 words path's plumbing (the int32 view, the table registers, the eight decoded
    codes put back in k order, several groups a step) with the PTX decode emulated
    (tests/support/ptx_emulation.py, imported now: under the interpreter flag this fixture set)."""
    import importlib

    emulation = importlib.reload(importlib.import_module("tests.support.ptx_emulation"))
    monkeypatch.setattr(_gemm, "interpreting", lambda: False)
    monkeypatch.setattr(_gemm, "codes8_to_f32", emulation.codes8_to_f32)
    layer = _layer(kind, n, k, group, quant_type, bias)
    x = _x(m, k)
    for config in [(*GROUPS, 1), (*SMALL, 1)]:
        _assert_matches(_gemm.wq_gemm(x, *layer, config, num_sms=sms), x, layer)
