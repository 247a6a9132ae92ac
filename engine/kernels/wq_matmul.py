"""Triton weight-only quantized matmul: out = x @ dequant(W).T (+ bias), dequantizing a tile to
x's dtype in the kernel and multiplying with tl.dot (one row: an fp32 multiply-add).

Weights in the layouts of engine/quant/weight_format.py (bitsandbytes' values, repacked once at
load):
- int8: qweight int8 [N, K], scales fp32 [N]: W[n, k] = qweight[n, k] * scales[n].
- int4: qweight uint8 [N, K / 2], two codes a byte (k even in the high nibble, bitsandbytes'
  order), absmax fp32 [N, K / group], code fp32 [16] (the NF4 or FP4 table):
  W[n, k] = code[nibble(n, k)] * absmax[n, k // group].
Activations are 16-bit (fp32 too, for the CPU interpreter); accumulation in fp32.

The engine runs it where no faster kernel was timed for the shape (engine/quant/dispatch.py):
one row without a split-K GEMV config (wq_gemv.py), and 2-16 rows without a decode-batch GEMM
config (wq_gemm.py). Configs are autotuned per (M bucket, N, K) on CUDA by Triton's autotuner;
the first call of a shape tunes (the engine's warm-up, before graph capture). No host sync and
no allocation beyond the output (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import interpreting
from engine.kernels.launch_math import cdiv

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# M, the step's row count, only masks rows; M_BUCKET (fixed per bucket) keys the autotuner.
@triton.jit(do_not_specialize=["M"])
def _wq_matmul_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    code_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    M_BUCKET,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    IS_INT4: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # Program (n, m) computes out[m-tile, n-tile]. M_BUCKET only keys the autotuner.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    dtype = x_ptr.dtype.element_ty
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    s_rows = s_ptr + offs_n.to(tl.int64)[:, None] * stride_sn
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    if IS_INT4:
        HALF: tl.constexpr = BLOCK_K // 2
        acc_w: tl.constexpr = HALF
    else:
        acc_w: tl.constexpr = BLOCK_K
    if BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, acc_w), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if IS_INT4:
            offs_j = k0 // 2 + tl.arange(0, HALF)  # byte index: k = 2j (high), 2j + 1 (low)
            j_mask = offs_j < K // 2
            wmask = n_mask[:, None] & j_mask[None, :]
            packed = tl.load(w_rows + offs_j[None, :], mask=wmask, other=0).to(tl.int32)
            scale = tl.load(s_rows + (2 * offs_j[None, :]) // GROUP, mask=wmask, other=0.0)
            w_even = tl.load(code_ptr + ((packed >> 4) & 0xF)) * scale  # [BLOCK_N, HALF]
            w_odd = tl.load(code_ptr + (packed & 0xF)) * scale
            xmask = m_mask[:, None] & j_mask[None, :]
            x_even = tl.load(x_rows + 2 * offs_j[None, :], mask=xmask, other=0.0)
            x_odd = tl.load(x_rows + 2 * offs_j[None, :] + 1, mask=xmask, other=0.0)
            if BLOCK_M == 1:
                acc += w_even * x_even.to(tl.float32) + w_odd * x_odd.to(tl.float32)
            else:
                acc += tl.dot(x_even, tl.trans(w_even.to(dtype)))
                acc += tl.dot(x_odd, tl.trans(w_odd.to(dtype)))
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            if BLOCK_M == 1:
                acc += w.to(tl.float32) * x.to(tl.float32)  # [BLOCK_N, BLOCK_K]
            else:
                acc += tl.dot(x, tl.trans(w.to(dtype)))  # int8 is exact in 16 bits
    if BLOCK_M == 1:
        res = tl.sum(acc, axis=1)[None, :]  # [1, BLOCK_N]
    else:
        res = acc
    if not IS_INT4:
        res = res * tl.load(s_ptr + offs_n * stride_sn, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        res += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, res.to(dtype), mask=m_mask[:, None] & n_mask[None, :])


def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int) -> triton.Config:
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages
    )


# M bucket -> candidate configs (the autotuner times them once per (bucket, N, K, kind)).
_CONFIGS = {
    1: [
        _cfg(1, bn, bk, w, s)
        for bn, bk, w, s in [
            (8, 256, 2, 4),
            (8, 512, 4, 3),
            (16, 256, 4, 4),
            (16, 512, 4, 3),
            (32, 256, 4, 3),
            (32, 128, 4, 4),
            (16, 1024, 8, 2),
            (64, 128, 4, 3),
        ]
    ],
    16: [
        _cfg(16, bn, bk, w, s)
        for bn, bk, w, s in [
            (32, 256, 4, 3),
            (64, 128, 4, 4),
            (32, 128, 4, 4),
            (64, 256, 4, 3),
            (128, 128, 8, 3),
        ]
    ],
    128: [
        _cfg(bm, bn, bk, w, s)
        for bm, bn, bk, w, s in [
            (64, 128, 64, 4, 4),
            (128, 128, 64, 8, 3),
            (128, 64, 64, 4, 4),
            (64, 64, 128, 4, 3),
        ]
    ],
}
# Under the CPU interpreter: one small config per bucket, no tuning.
_INTERPRET_BLOCKS = {1: (1, 16, 64), 16: (16, 16, 64), 128: (32, 32, 64)}


def _m_bucket(m: int) -> int:
    return 1 if m == 1 else 16 if m <= 16 else 128


_tuned: dict[int, object] = {}
"""M bucket -> the autotuned kernel: Triton's autotuner times its configs per key on the device,
the same for every engine in the process (a cache of wrappers, not an engine's choice)."""


def _tuned_kernel(bucket: int):
    if bucket not in _tuned:
        _tuned[bucket] = triton.autotune(
            configs=_CONFIGS[bucket], key=["M_BUCKET", "N", "K", "IS_INT4", "GROUP"]
        )(_wq_matmul_kernel)
    return _tuned[bucket]


def wq_matmul(
    x: torch.Tensor,  # [..., K], fp16 / bf16 (fp32 too)
    qweight: torch.Tensor,  # int8 [N, K] or uint8 [N, K / 2]
    scales: torch.Tensor,  # fp32 [N] (int8) or [N, K / group] (int4)
    code: torch.Tensor | None = None,  # fp32 [16] (int4)
    bias: torch.Tensor | None = None,  # [N]
    group_size: int = 64,
    block: tuple[int, int, int] | None = None,  # (BLOCK_M, BLOCK_N, BLOCK_K): skip tuning
) -> torch.Tensor:  # [..., N] in x's dtype
    """x @ dequant(qweight).T + bias; see the module docstring for the layouts."""
    is_int4 = qweight.dtype == torch.uint8
    if qweight.dtype not in (torch.int8, torch.uint8) or qweight.dim() != 2:
        raise ValueError(f"wq_matmul: qweight must be 2-D int8 or uint8, got {qweight.dtype}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"wq_matmul: x must be fp16, bf16 or fp32, got {x.dtype}")
    n, k = qweight.shape[0], qweight.shape[1] * (2 if is_int4 else 1)
    if x.shape[-1] != k:
        raise ValueError(f"wq_matmul: x has {x.shape[-1]} features, the weight expects {k}")
    want = (n, k // group_size) if is_int4 else (n,)
    if scales.dtype != torch.float32 or tuple(scales.shape) != want:
        raise ValueError(
            f"wq_matmul: scales must be fp32 {want}, got {scales.dtype} {tuple(scales.shape)}"
        )
    if is_int4 and (code is None or code.numel() != 16 or code.dtype != torch.float32):
        raise ValueError("wq_matmul: int4 weights need code, the fp32 [16] table")
    if is_int4 and (group_size % 2 or k % group_size):
        raise ValueError(f"wq_matmul: K={k} must be a multiple of the even group {group_size}")
    if qweight.stride(1) != 1 or scales.stride(-1) != 1:
        raise ValueError("wq_matmul: qweight and scales must have a unit-stride last dim")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"wq_matmul: bias must be [{n}], got {tuple(bias.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.view(*lead, n)
    bucket = _m_bucket(m)
    args = (
        x2,
        qweight,
        scales,
        code if is_int4 else scales,
        bias if bias is not None else scales,
        out,
        m,
        n,
        k,
        bucket,
        x2.stride(0),
        qweight.stride(0),
        scales.stride(0),
        out.stride(0),
    )
    consts = dict(IS_INT4=is_int4, GROUP=group_size if is_int4 else 1, HAS_BIAS=bias is not None)
    if block is None and interpreting():
        block = _INTERPRET_BLOCKS[bucket]
    if block is not None:
        bm, bn, bk = block
        grid = (cdiv(n, bn), cdiv(m, bm))
        _wq_matmul_kernel[grid](*args, **consts, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
    else:

        def grid(meta):
            return (cdiv(n, meta["BLOCK_N"]), cdiv(m, meta["BLOCK_M"]))

        _tuned_kernel(bucket)[grid](*args, **consts)
    return out.view(*lead, n)
