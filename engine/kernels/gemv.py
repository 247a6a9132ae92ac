"""Triton split-K GEMV for batch-1 decode: out[1, N] = x[1, K] @ W[N, K].T (+ bias).

Batch-1 decode is a pass over every weight byte; cuBLAS reached about 74% of the copy
bandwidth on the Llama-3-8B shapes (H200, 2026-11-29), short of the 85% workload B needs. Each
program reads a [BLOCK_N, K / SPLIT_K] slab of W and writes one fp32 partial per row; a second
kernel sums the SPLIT_K partials (SPLIT_K=1: the first kernel writes the output itself). Enough
programs keep many loads in flight even when N is small (o_proj, down_proj).

Whether it beats cuBLAS is measured, not assumed: start-up timing (engine/startup/kernel_choices.py)
times both per weight shape on the device, in a CUDA graph over the model's own weights, before the
decode graphs are captured; the model's linears use the winner.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from engine.kernels import pdl
from engine.kernels.launch_math import cdiv
from engine.kernels.rmsnorm import round_to

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (BLOCK_N, BLOCK_K, num_warps): candidates, timed at start-up on the device
# (engine/startup/kernel_choices.py)
CONFIGS = [(8, 512, 4), (16, 256, 4), (32, 256, 8), (4, 1024, 4), (16, 512, 8)]
FUSED_CONFIGS = [(4, 512, 4), (8, 256, 4), (4, 1024, 8), (8, 512, 4)]
"""Candidates for gemv_silu_mul: each program reads two row blocks, so fewer rows than the
plain GEMV's best may suit it."""


@triton.jit
def weight_tile(rows, offs_k, k_end, n_mask):
    """W[rows, offs_k], zero past k_end and past the last row (n_mask)."""
    mask = n_mask[:, None] & (offs_k < k_end)[None, :]
    return tl.load(rows + offs_k[None, :], mask=mask, other=0)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    N,
    K,
    stride_wn,
    k_per_split,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # PDL: engine/kernels/pdl.py. The first weight tile is loaded before gdc_wait; each loop
    # step loads the next tile before using this one.
    if PDL:
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    offs_t = tl.arange(0, BLOCK_K)
    w_next = weight_tile(rows, k_start + offs_t, k_end, n_mask)
    if PDL:
        gdc_wait()
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + offs_t
        k_mask = offs_k < k_end
        w = w_next
        w_next = weight_tile(rows, offs_k + BLOCK_K, k_end, n_mask)
        x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    partial = tl.sum(acc, axis=1)  # [BLOCK_N]
    if SPLIT_K == 1:
        if HAS_BIAS:
            partial += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs_n, partial.to(out_ptr.dtype.element_ty), mask=n_mask)
    else:
        tl.store(part_ptr + pid_k * N + offs_n, partial, mask=n_mask)


@triton.jit
def _gemv_silu_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    N,
    K,
    stride_wn,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # W is [2N, K], gate rows then up rows; out[1, N] = silu(gate) * up, rounded where the two
    # steps (this file's GEMV, then silu_mul.py) round. PDL as in _gemv_kernel.
    if PDL:
        gdc_launch_dependents()
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    up_rows = rows + N * stride_wn
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    offs_t = tl.arange(0, BLOCK_K)
    w_next = weight_tile(rows, offs_t, K, n_mask)
    up_next = weight_tile(up_rows, offs_t, K, n_mask)
    if PDL:
        gdc_wait()
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + offs_t
        k_mask = offs_k < K
        w = w_next
        w_up = up_next
        w_next = weight_tile(rows, offs_k + BLOCK_K, K, n_mask)
        up_next = weight_tile(up_rows, offs_k + BLOCK_K, K, n_mask)
        x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        acc += w.to(tl.float32) * x
        acc_up += w_up.to(tl.float32) * x
    gate = tl.sum(acc, axis=1)
    up = tl.sum(acc_up, axis=1)
    if HAS_BIAS:
        gate += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        up += tl.load(bias_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    gate = round_to(gate, dtype)
    act = round_to(gate / (1.0 + tl.exp(-gate)), dtype)
    # round_to: round to nearest even under the CPU interpreter too (its cast truncates)
    out = round_to(act * round_to(up, dtype), dtype)
    tl.store(out_ptr + offs_n, out.to(dtype), mask=n_mask)


@triton.jit
def _reduce_kernel(
    part_ptr,
    bias_ptr,
    out_ptr,
    N,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):
        total += tl.load(part_ptr + s * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms_for(x: torch.Tensor, num_sms: int | None) -> int:
    """The SM count split-K plans for: given, the device's, or 4 under the CPU interpreter."""
    if num_sms is not None:
        return num_sms
    return _num_sms(x.device.index or 0) if x.is_cuda else 4


def split_k_for(n: int, k: int, block_n: int, block_k: int, num_sms: int) -> int:
    """Splits along K so the grid has about 4 programs per SM, each at least 4 K-tiles long."""
    programs = cdiv(n, block_n)
    want = max(1, (4 * num_sms) // programs)
    return max(1, min(want, k // (4 * block_k)))


def gemv(
    x: torch.Tensor,  # [1, K]
    weight: torch.Tensor,  # [N, K], unit stride along K
    bias: torch.Tensor | None = None,  # [N]
    config: tuple[int, int, int] = CONFIGS[0],
    num_sms: int | None = None,
) -> torch.Tensor:  # [1, N] in x's dtype
    """x @ weight.T + bias for one row, by the split-K Triton kernel."""
    _check(x, weight, bias)
    n, k = weight.shape
    block_n, block_k, warps = config
    split, k_per_split, out, part = plan_split(x, n, k, block_n, block_k, num_sms)
    b = bias if bias is not None else out
    grid = (cdiv(n, block_n), split)
    use_pdl = pdl.enabled(x)
    _gemv_kernel[grid](
        x,
        weight,
        b,
        out,
        part,
        n,
        k,
        weight.stride(0),
        k_per_split,
        SPLIT_K=split,
        HAS_BIAS=bias is not None,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PDL=use_pdl,
        num_warps=warps,
        launch_pdl=use_pdl,
    )
    reduce_split(part, bias, out)
    return out


def plan_split(
    x: torch.Tensor, n: int, k: int, block_n: int, block_k: int, num_sms: int | None
) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(SPLIT_K, K per split in whole tiles, the [1, N] output, the fp32 [SPLIT_K, N]
    partials: the output itself when SPLIT_K is 1) for a split-K GEMV of one row."""
    split = split_k_for(n, k, block_n, block_k, num_sms_for(x, num_sms))
    k_per_split = cdiv(cdiv(k, split), block_k) * block_k
    split = cdiv(k, k_per_split)
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    part = torch.empty(split, n, dtype=torch.float32, device=x.device) if split > 1 else out
    return split, k_per_split, out, part


def reduce_split(part: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """out = sum of the partials (+ bias); nothing to do when the kernel wrote out itself."""
    split, n = part.shape
    if part is out:
        return
    use_pdl = pdl.enabled(out)
    _reduce_kernel[(cdiv(n, 1024),)](
        part,
        bias if bias is not None else out,
        out,
        n,
        SPLIT_K=split,
        HAS_BIAS=bias is not None,
        BLOCK=1024,
        PDL=use_pdl,
        launch_pdl=use_pdl,
    )


def gemv_silu_mul(
    x: torch.Tensor,  # [1, K]
    weight: torch.Tensor,  # [2I, K]: gate rows, then up rows
    bias: torch.Tensor | None,  # [2I]
    config: tuple[int, int, int],
    num_sms: int | None = None,
) -> torch.Tensor | None:  # [1, I]
    """silu(x @ gate.T) * (x @ up.T) in one kernel (the gated MLP's first half at batch 1),
    equal to silu_and_mul(gemv(...)); None where the rows alone give too few programs (that
    shape would need split-K, which this fused form does not do)."""
    _check(x, weight, bias)
    n, k = weight.shape[0] // 2, weight.shape[1]
    block_n, block_k, warps = config
    if weight.shape[0] % 2 or split_k_for(n, k, block_n, block_k, num_sms_for(x, num_sms)) > 1:
        return None
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    use_pdl = pdl.enabled(x)
    _gemv_silu_kernel[(cdiv(n, block_n),)](
        x,
        weight,
        bias if bias is not None else out,
        out,
        n,
        k,
        weight.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PDL=use_pdl,
        num_warps=warps,
        launch_pdl=use_pdl,
    )
    return out


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"gemv: x must be [1, K], got {tuple(x.shape)}")
    n, k = weight.shape
    if x.shape[1] != k or weight.dtype != x.dtype or x.dtype not in _DTYPES:
        raise ValueError(
            f"gemv: x {tuple(x.shape)} {x.dtype} does not match weight {tuple(weight.shape)} "
            f"{weight.dtype} (fp16, bf16 or fp32, same dtype)"
        )
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("gemv: weight and x need a unit-stride last dim")
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"gemv: bias must be contiguous [{n}], got {tuple(bias.shape)}")
