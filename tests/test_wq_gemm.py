"""The dequantizing GEMM for decode batches (engine/kernels/wq_gemm.py) against the
dequantize-then-matmul reference: ragged shapes under Triton's CPU interpreter (int8, NF4,
FP4, bias, split K), its routing and start-up choice, and on a GPU every config on
Llama-3-8B's shapes and a batched QuantLinear through the choice."""

from __future__ import annotations

import pytest
import torch

from engine.models.quant import wq_matmul_ref
from tests.quant_weights import random_quant_weight
from tests.triton_modules import HAS_CUDA, import_kernel_modules

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
        16, 16, 32, 32, 64, 64, 128, 256, None,
    ]  # fmt: skip


def test_gemm_for_runs_only_what_was_chosen(monkeypatch):
    layer = _layer("int8", 24, 128, 0)
    x = _x(20, 128)
    monkeypatch.setattr(_gemm, "_choice", {})
    assert _gemm.gemm_for(x, layer) is None  # nothing chosen: the caller dequantizes
    _gemm._choice[_gemm._key(layer, x.dtype, 32)] = SMALL
    _assert_matches(_gemm.gemm_for(x, layer), x, layer)
    assert _gemm.gemm_for(_x(40, 128), layer) is None  # bucket 64 was not chosen
    x3 = x.view(4, 5, 128)  # leading dims are kept
    assert _gemm.gemm_for(x3, layer).shape == (4, 5, 24)


@pytest.mark.parametrize(
    "kernel_seconds,wrong,fails,kept",
    [(1.0, False, False, True), (3.0, False, False, False), (1.0, True, False, False),
     (1.0, False, True, False)],
)  # fmt: skip
def test_choose_keeps_a_config_only_when_right_and_faster(
    monkeypatch, kernel_seconds, wrong, fails, kept
):
    """choose() with the device timing replaced (dequantize + matmul: 2 s): a config is kept
    only when it matches the reference and is faster; a wrong or failing one never is."""
    import engine.timing as timing

    layer = _layer("int4", 16, 128, 64)
    real = _gemm.wq_gemm

    def kernel(*args, **kw):
        if fails:
            raise RuntimeError("does not compile here")
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
    monkeypatch.setattr(_gemm, "_choice", {})
    monkeypatch.setattr(
        _gemm, "CONFIGS", {"int8": {16: [], 32: []}, "int4": {16: [SMALL], 32: [SMALL]}}
    )
    monkeypatch.setattr(timing, "graph_seconds", seconds)
    _gemm.choose([layer] * 2, torch.float16, max_rows=24)
    chosen = SMALL if kept else None
    assert _gemm._choice == {_gemm._key(layer, torch.float16, b): chosen for b in (16, 32)}


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
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
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_choice_and_batched_linear_gpu(kind, monkeypatch):
    """gate_up at 8, 32 and 64 rows: the choice made (either way, printed) and a QuantLinear of
    that many rows, whichever path it takes, matching the reference."""
    from engine.models.quant import QuantLinear, WeightQuant

    monkeypatch.setattr(_gemm, "_choice", {})
    dtype = torch.bfloat16
    q, s, code, _, group = _layer(kind, 28672, 4096, 64, dtype=dtype)
    _gemm.choose([(q, s, code, None, group)] * 4, dtype, max_rows=64)
    linear = QuantLinear(4096, 28672, False, WeightQuant(kind, group_size=64), dtype, "cuda")
    linear.qweight.copy_(q)
    linear.scales.copy_(s)
    if code is not None:
        linear.code.copy_(code)
    for m in (8, 32, 64):
        x = _x(m, 4096, dtype)
        _assert_matches(linear(x), x, (q, s, code, None, group))
        chosen = _gemm._choice[_gemm._key((q, s, code, None, group), dtype, _gemm.bucket_for(m))]
        print(f"{kind} gate_up {m} rows: {chosen or 'the path without the GEMM'}")


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter's stand-in for the PTX decode")
@pytest.mark.parametrize("kind,m,n,k,group,quant_type,bias,sms", CASES[2:])
def test_int4_words_path_in_the_interpreter(
    monkeypatch, kind, m, n, k, group, quant_type, bias, sms
):
    """The int4 words path's plumbing (the int32 view, the table registers, the eight decoded
    codes put back in k order, several groups a step) with the PTX decode emulated
    (tests/ptx_emulation.py, imported now: under the interpreter flag this fixture set)."""
    import importlib

    emulation = importlib.reload(importlib.import_module("tests.ptx_emulation"))
    monkeypatch.setattr(_gemm, "interpreting", lambda: False)
    monkeypatch.setattr(_gemm, "codes8_to_f32", emulation.codes8_to_f32)
    layer = _layer(kind, n, k, group, quant_type, bias)
    x = _x(m, k)
    for config in [(*GROUPS, 1), (*SMALL, 1)]:
        _assert_matches(_gemm.wq_gemm(x, *layer, config, num_sms=sms), x, layer)
