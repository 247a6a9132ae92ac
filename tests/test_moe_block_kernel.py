"""MoEBlock through the Triton fused_moe (under Triton's CPU interpreter without a GPU) agrees
with the block through fused_moe_ref: the block hands its routing and stacked experts (16-bit,
or int8 / int4 codes with their scales) to the kernel in its signature, for each routing rule,
with and without biases, fp32 and bf16."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.models import moe_block as moe
from engine.models.moe_block import MoEBlock, softmax_topk, softmax_topk_renormalized, topk_softmax
from engine.quant.weight_format import WeightQuant
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

_align, _kernel = import_kernel_modules(
    [("moe_align", "_align_kernel"), ("moe", "_gate_up_kernel")]
)
DEVICE = "cuda" if HAS_CUDA else "cpu"
HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _block(rule, bias: bool, dtype: torch.dtype, gen: torch.Generator) -> MoEBlock:
    hidden, inter, experts, k = 64, 32, 8, 2
    block = MoEBlock(hidden, inter, experts, k, rule, router_bias=bias, expert_bias=bias)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / hidden**0.5)
    return block.to(DEVICE, dtype)


def _both(block: MoEBlock, x: torch.Tensor, monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(through the kernel, through the reference)."""
    with torch.no_grad():
        monkeypatch.setattr(moe, "moe_kernel", lambda x: moe.fused_moe_ref)
        want = block(x)
        monkeypatch.setattr(moe, "moe_kernel", lambda x: _kernel.fused_moe)
        got = block(x)
    return got, want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rule", [softmax_topk, softmax_topk_renormalized, topk_softmax])
def test_block_through_the_kernel_matches_the_reference(rule, bias, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(7 + bias)
    block = _block(rule, bias, dtype, gen)
    x = torch.randn(13, 64, generator=gen).to(DEVICE, dtype)
    got, want = _both(block, x, monkeypatch)
    assert got.dtype == dtype and got.shape == x.shape
    # bf16: the kernel rounds its intermediate rows to bf16 as the reference does, in another
    # order; fp32 differs by summation order only
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed")
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_block_through_the_kernel_matches_its_dequantized_reference(kind, monkeypatch):
    """The kernel reads the codes and scales; the reference path dequantizes them."""
    gen = torch.Generator().manual_seed(11)
    block = _block(softmax_topk_renormalized, True, torch.float32, gen)
    block.quantize_experts(WeightQuant(kind, group_size=32))
    assert block.w_down.dtype == (torch.int8 if kind == "int8" else torch.uint8)
    assert "w_gate_up" not in dict(block.named_parameters())  # codes are buffers
    x = torch.randn(13, 64, generator=gen).to(DEVICE)
    got, want = _both(block, x, monkeypatch)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
