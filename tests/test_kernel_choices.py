"""Start-up kernel choices: engine.timing.fastest_config skips only what a device cannot run,
and each engine's choices live in its own KernelChoices, handed to its own modules, so two
engines in one process never share one (the device timing replaced; without a GPU, Triton's
CPU interpreter runs the kernels)."""

from __future__ import annotations

import pytest
import torch

import engine.timing as timing
from tests.support.quant_weights import random_quant_weight
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

(_wq_gemv, _gemm) = import_kernel_modules(
    [("wq_gemv", "_wq_gemv_kernel"), ("wq_gemm", "_wq_gemm_kernel")]
)
from triton.runtime.errors import OutOfResources  # noqa: E402  (after the interpreter flag)

from engine.quant.modules import QuantLinear  # noqa: E402
from engine.quant.weight_format import WeightQuant  # noqa: E402
from engine.startup.kernel_choices import KernelChoices  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _fake_seconds(monkeypatch, seconds: dict) -> None:
    """graph_seconds replaced: run the timed function once, return seconds[its result]."""
    monkeypatch.setattr(timing, "graph_seconds", lambda fn: seconds[fn()])


def _timed(cfg, item):
    """A candidate's call: its output (the reference for 'ok'), or the error it raises."""
    if cfg == "no room":
        raise OutOfResources(300_000, 232_448, "shared memory")
    if cfg == "bug":
        raise RuntimeError("a bug in the launch")
    return torch.ones(2) * (2.0 if cfg == "wrong" else 1.0)


def test_fastest_config_keeps_the_fastest_right_config(monkeypatch):
    calls = []

    def call(cfg, item):
        calls.append((cfg, item))
        return _timed(cfg, item)

    seconds = {"slow": 3.0, "fast": 1.0, "wrong": 0.1}
    monkeypatch.setattr(timing, "graph_seconds", lambda fn: fn() or seconds[calls[-1][0]])
    ref = torch.ones(2)
    assert timing.fastest_config(["slow", "wrong", "fast"], call, ["a", "b"], ref) == "fast"
    assert ("fast", "b") in calls  # timed over every item
    assert timing.fastest_config(["wrong"], call, ["a"], ref) is None  # none ran


def test_fastest_config_skips_what_the_device_cannot_run(monkeypatch):
    _fake_seconds(monkeypatch, {None: 1.0})
    ref = torch.ones(2)
    assert timing.fastest_config(["no room", "ok"], _timed, ["a"], ref) == "ok"
    assert timing.fastest_config(["no room"], _timed, ["a"], ref) is None


def test_fastest_config_lets_every_other_error_through(monkeypatch):
    _fake_seconds(monkeypatch, {None: 1.0})
    with pytest.raises(RuntimeError, match="a bug in the launch"):
        timing.fastest_config(["ok", "bug"], _timed, ["a"], torch.ones(2))


def _gate_up(seed: int) -> torch.nn.ModuleDict:
    """A model of one int4 gate-and-up QuantLinear, 32 x 128."""
    linear = QuantLinear(128, 32, False, WeightQuant("int4"), torch.float16, DEVICE)
    q, s, _, _ = random_quant_weight("int4", 32, 128, 64, DEVICE, seed=seed)
    linear.qweight.data.copy_(q)
    linear.scales.data.copy_(s)
    return torch.nn.ModuleDict({"gate_up_proj": linear})


def test_two_engines_share_no_choice(monkeypatch):
    """Two engines' models of the same shape, timed into their own KernelChoices: one where
    the decode-batch GEMM is faster, one where it is slower. Each keeps its own answer, its
    module holds that answer, and an untouched KernelChoices stays empty."""
    from engine.quant.quant_choices import tune_quant_linears

    gemm_ran = []
    real = _gemm.wq_gemm
    monkeypatch.setattr(_gemm, "wq_gemm", lambda *a, **kw: gemm_ran.append(1) or real(*a, **kw))

    def tune(model, gemm_seconds: float) -> KernelChoices:
        def seconds(fn):
            gemm_ran.clear()
            fn()
            return gemm_seconds if gemm_ran else 2.0

        monkeypatch.setattr(timing, "graph_seconds", seconds)
        choices = KernelChoices()
        tune_quant_linears(list(model.named_children()), choices.quant, torch.float16, 16)
        return choices

    fast, slow, untouched = _gate_up(0), _gate_up(1), KernelChoices()
    fast_choices = tune(fast, gemm_seconds=1.0)
    slow_choices = tune(slow, gemm_seconds=3.0)
    config = _gemm.CONFIGS["int4"][16][0]
    assert fast["gate_up_proj"].kernels.gemm == {16: config}
    assert slow["gate_up_proj"].kernels.gemm == {}  # not the other engine's choice
    assert [b for b in fast_choices.quant.gemm.values()] == [{16: config}]
    assert [b for b in slow_choices.quant.gemm.values()] == [{16: None}]
    assert fast["gate_up_proj"].kernels.gemv in _wq_gemv.CONFIGS["int4"]
    assert untouched == KernelChoices()
