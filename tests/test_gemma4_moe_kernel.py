"""Gemma4MoE through the Triton fused_moe (compiled on a GPU, under Triton's CPU interpreter
otherwise) agrees with the block through fused_moe_ref: its own routing (per-expert scales
included) and its gelu_tanh experts reach the kernel as the reference reads them."""

from __future__ import annotations

import pytest
import torch

from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

_align, _kernel = import_kernel_modules(
    [("moe_align", "_align_kernel"), ("moe", "_gate_up_kernel")]
)

from engine.models import moe_block as moe  # noqa: E402  (after the kernels: see import_kernel_modules)
from tests.test_gemma4_moe import HIDDEN, _checkpoint, _ours  # noqa: E402


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _check_kernel_against_reference(device: str, dtype: torch.dtype, monkeypatch) -> None:
    block = _ours(_checkpoint(seed=31)).to(device, dtype)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(29, HIDDEN, generator=gen) + 3 * torch.randn(HIDDEN, generator=gen)
    x = x.to(device, dtype)
    with torch.no_grad():
        monkeypatch.setattr(moe, "moe_kernel", lambda x: moe.fused_moe_ref)
        want = block(x)
        monkeypatch.setattr(moe, "moe_kernel", lambda x: _kernel.fused_moe)
        got = block(x)
    assert got.dtype == dtype and got.shape == x.shape
    # bf16: the kernel rounds its intermediate rows to bf16 as the reference does, in another
    # order; fp32 differs by summation order only
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_through_the_kernel_matches_the_reference(dtype, monkeypatch):
    _check_kernel_against_reference("cuda" if HAS_CUDA else "cpu", dtype, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_through_the_compiled_kernel_on_the_gpu(dtype, monkeypatch):
    """The same check where the kernel is compiled; the CUDA block picks the kernel itself."""
    block = _ours(_checkpoint(seed=32)).to("cuda", dtype)
    x = torch.randn(300, HIDDEN, generator=torch.Generator().manual_seed(6)).to("cuda", dtype)
    with torch.no_grad():
        assert moe.moe_kernel(x) is not moe.fused_moe_ref
        got = block(x)
        monkeypatch.setattr(moe, "moe_kernel", lambda x: moe.fused_moe_ref)
        want = block(x)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
