"""Programmatic dependent launch (engine/kernels/pdl.py): where it is used, and, on a GPU, that
a batch-1 decode chain replayed in a CUDA graph gives the same bits with it on and off."""

from __future__ import annotations

import pytest
import torch

from tests.support.triton_modules import HAS_CUDA

pytest.importorskip("triton")


def test_not_used_off_cuda_or_for_several_rows(monkeypatch):
    from engine.kernels import pdl

    assert not pdl.enabled(torch.zeros(1, 8))  # CPU tensors: the interpreter has no GDC
    if HAS_CUDA:
        assert not pdl.enabled(torch.zeros(2, 8, device="cuda"))  # batches keep plain launches
        monkeypatch.setenv("APPLIANCE_PDL", "0")
        assert not pdl.enabled(torch.zeros(1, 8, device="cuda"))


@pytest.mark.gpu
def test_decode_chain_is_the_same_with_and_without_pdl_gpu(monkeypatch):
    from engine.kernels.gemv import gemv
    from engine.kernels.rmsnorm import rms_norm
    from engine.kernels.silu_mul import silu_and_mul
    from engine.kernels.wq_gemv import wq_gemv, wq_gemv_silu
    from engine.timing import graph_seconds

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden, inter, layers = 1024, 2816, 4

    def int8(n, k):
        q = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
        return (q, torch.rand(n, device="cuda", generator=g) / 127 / k**0.5, None, None, 64)

    ws = [
        dict(
            qkv=torch.randn(3 * hidden, hidden, device="cuda", generator=g).bfloat16() / 32,
            gate_up=int8(2 * inter, hidden),
            down=int8(hidden, inter),
        )
        for _ in range(layers)
    ]
    x = torch.randn(1, hidden, device="cuda", generator=g).bfloat16()
    norm = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)

    def chain():
        h, res = rms_norm(x, norm, 1e-5), x
        for w in ws:
            a = gemv(h, w["qkv"], None, (8, 256, 4))[:, :hidden]
            h, res = rms_norm(a, norm, 1e-5, res)
            act = wq_gemv_silu(h, *w["gate_up"], (16, 256, 4))
            act2 = silu_and_mul(wq_gemv(h, *w["gate_up"], (8, 256, 4)))  # the two steps
            down = wq_gemv(act + act2, *w["down"], (8, 256, 4))  # split K in 2: a reduce kernel
            h, res = rms_norm(down, norm, 1e-5, res)
        return h

    outs = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("APPLIANCE_PDL", setting)
        captured = {}

        def run(captured=captured):
            captured["out"] = chain()

        graph_seconds(run)  # runs once eagerly, then captures and replays
        outs[setting] = captured["out"].clone()
    assert torch.isfinite(outs["1"]).all()
    assert torch.equal(outs["0"], outs["1"])
