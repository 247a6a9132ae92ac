"""Triton GEMM for decode batches: out[M, N] = x[M, K] @ W[N, K].T (+ bias), 2 <= M <= 256.

A decode step of many sequences multiplies a few hundred rows by each weight. There cuBLAS
left a lot on the table for the narrow projections (H200, Llama-3-8B, M=256: o_proj took
about 50 us a call against an 11 us compute floor, through a split-K kernel and its reduction),
because 256 x 4096 outputs make too few 128 x 128 tiles for 132 SMs. This kernel tiles the
output in BLOCK_M x BLOCK_N blocks (narrower ones fill the SMs), walks K with tl.dot in fp32,
and rounds once on the store.

Whether it is used is measured, not assumed: `choose_configs` times cuBLAS and each config per
weight shape and row bucket (16, 32, ..., 256) in a CUDA graph over the model's own weights,
before the decode graphs are captured, and keeps the fastest (cuBLAS where it wins).
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from engine.kernels.paged_args import dot_dtype
from engine.kernels.rmsnorm import round_to
from engine.timing import fastest_config

log = logging.getLogger(__name__)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BUCKETS = (16, 32, 64, 128, 256)
"""Row counts timed: a decode batch of M rows uses the choice of the smallest bucket >= M."""
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) candidates; BLOCK_M above M is skipped
CONFIGS = [
    (16, 64, 128, 4, 4), (32, 64, 128, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4), (128, 128, 64, 8, 3),
]  # fmt: skip


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # Program (n, m): out[m-tile, n-tile]; the m tiles of one n tile run side by side, so a
    # weight tile is read from memory once and from L2 by its neighbours.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + offs_k) < K
        a = tl.load(x_rows + k0 + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)  # fmt: skip
        b = tl.load(w_rows + k0 + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0)  # fmt: skip
        acc = tl.dot(a.to(DOT_DTYPE), tl.trans(b.to(DOT_DTYPE)), acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    # round_to: round to nearest even under the CPU interpreter too (its cast truncates)
    tl.store(out, round_to(acc, dtype).to(dtype), mask=m_mask[:, None] & n_mask[None, :])


def gemm(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K], unit stride along K
    bias: torch.Tensor | None,  # [N]
    config: tuple[int, int, int, int, int],
) -> torch.Tensor:  # [M, N] in x's dtype
    """x @ weight.T + bias by the tiled Triton kernel (any M; meant for decode batches)."""
    if x.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemm: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    if x.dtype != weight.dtype or x.dtype not in _DTYPES:
        raise ValueError(f"gemm: x {x.dtype} and weight {weight.dtype} must share a float dtype")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("gemm: x and weight need a unit-stride last dim")
    m, k = x.shape
    n = weight.shape[0]
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"gemm: bias must be contiguous [{n}], got {tuple(bias.shape)}")
    block_m, block_n, block_k, warps, stages = config
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _gemm_kernel[grid](
        x, weight, bias if bias is not None else out, out, m, n, k,
        x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_DTYPE=dot_dtype(x.dtype, _gemm_kernel),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def bucket(m: int) -> int | None:
    """The timed row bucket that serves an M-row call; None above the largest (cuBLAS)."""
    return next((b for b in BUCKETS if m <= b), None)


_choice: dict[tuple, tuple | None] = {}
"""(N, K, dtype, device, has bias, bucket) -> the winning config; None where cuBLAS won."""


def _key(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> tuple:
    return (*weight.shape, weight.dtype, weight.device, bias is not None, rows)


def gemm_config(weight: torch.Tensor, bias: torch.Tensor | None, m: int):
    """The config chosen for an M-row call on this weight's shape, or None: cuBLAS (it won,
    M is outside the buckets, or nothing was chosen: choose_configs runs before capture)."""
    rows = bucket(m)
    return None if rows is None else _choice.get(_key(weight, bias, rows))


def choose_configs(
    linears: list[tuple[torch.Tensor, torch.Tensor | None]], max_rows: int = BUCKETS[-1]
) -> None:
    """Time cuBLAS against each config for every (weight, bias) shape and row bucket up to
    max_rows, in a CUDA graph over all the weights of that shape, and keep the fastest."""

    groups: dict[tuple, list] = {}
    for w, b in linears:  # 16-bit only: fp32 models keep cuBLAS's exact fp32 (no tf32)
        if w.is_cuda and w.dim() == 2 and w.dtype in _DTYPES[:2] and w.stride(1) == 1:
            groups.setdefault(_key(w, b, 0)[:-1], []).append((w, b))
    # every bucket a decode batch of up to max_rows rows maps to (bucket() rounds up)
    wanted = BUCKETS[: BUCKETS.index(bucket(min(max_rows, BUCKETS[-1]))) + 1]
    for key, pairs in groups.items():
        for rows in wanted:
            if (*key, rows) in _choice:
                continue
            w0, b0 = pairs[0]
            x = torch.randn(rows, w0.shape[1], dtype=w0.dtype, device=w0.device)
            ref = torch.nn.functional.linear(x, w0, b0).float()

            def call(cfg, pair, x=x):
                if cfg is None:
                    return torch.nn.functional.linear(x, *pair)
                return gemm(x, *pair, cfg)

            fits = [c for c in CONFIGS if c[0] <= rows]
            # 8 weights: past L2 (even o_proj's 32 MiB x 8), and the graph's 8 outputs stay
            # small beside a KV pool that is already allocated (256 x 28672 x 2 B = 14 MiB each)
            _choice[(*key, rows)] = fastest_config([None, *fits], call, pairs[:8], ref)
            log.info("decode linear %dx%d at %d rows: %s", key[0], key[1], rows,
                     _choice[(*key, rows)] or "cuBLAS")  # fmt: skip
    torch.cuda.empty_cache()
