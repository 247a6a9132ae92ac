"""MoEBlock through the Triton fused_moe (under Triton's CPU interpreter without a GPU) agrees
with the block through fused_moe_ref: the block hands its routing and stacked experts to the
kernel in its signature, for each routing rule, with and without biases, fp32 and bf16."""

from __future__ import annotations

import pytest
import torch

from engine.models import moe
from engine.models.moe import MoEBlock, softmax_topk, softmax_topk_renormalized, topk_softmax
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

_align, _kernel = import_kernel_modules(
    [("moe_align", "_align_kernel"), ("moe", "_gate_up_kernel")]
)
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rule", [softmax_topk, softmax_topk_renormalized, topk_softmax])
def test_block_through_the_kernel_matches_the_reference(rule, bias, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(7 + bias)
    hidden, inter, experts, k, tokens = 32, 16, 8, 2, 13
    block = MoEBlock(hidden, inter, experts, k, rule, router_bias=bias, expert_bias=bias)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / hidden**0.5)
    block = block.to(DEVICE, dtype)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    with torch.no_grad():
        monkeypatch.setattr(moe, "moe_kernel", lambda x: moe.fused_moe_ref)
        want = block(x)
        monkeypatch.setattr(moe, "moe_kernel", lambda x: _kernel.fused_moe)
        got = block(x)
    assert got.dtype == dtype and got.shape == x.shape
    # bf16: the kernel rounds its intermediate rows to bf16 as the reference does, in another
    # order; fp32 differs by summation order only
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
