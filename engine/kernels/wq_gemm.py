"""Triton GEMM for decode batches (2-256 rows) with weight-only quantized weights, dequantizing
in the kernel: out[M, N] = x[M, K] @ dequant(W).T (+ bias), in engine/quant/weight_format.py's
layouts.

Without it a batch of more than 16 rows dequantizes every weight to 16 bits and calls cuBLAS,
in every decode step: int8 reads 1 byte a weight, writes 2 and cuBLAS reads those 2 again (5
bytes of traffic a weight); int4 about 4.5. (2-16 rows take wq_matmul's tl.dot kernel.) Here
each weight is read once in its packed form (1 byte int8, half a byte int4 plus its group's
scale) and widened in registers, so a decode batch should cost little more than a batch-1
step.

The product is computed transposed, acc[BLOCK_N, BLOCK_M] = W_tile @ x_tile.T: the weight rows
(thousands) fill the tensor-core instruction's M side and the few batch rows its N side, and
the weight tile, widened in registers, is the operand that may stay there.
- int8: the tile is widened to x's 16-bit type (exact for every int8); the row scale multiplies
  the fp32 sum once, in the epilogue.
- int4: a K-step is one or more whole scale groups. Each code's table value is multiplied by
  its group's scale in fp32 and rounded once to x's type. The value comes from the 16-entry
  table in L1 (the weights engine/quant/reference.py's dequantize_to gives), or on CUDA, where a
  config asks for words, from int32 words of eight codes decoded in registers against the
  table in fp16 (ptx_decode.codes8_to_f32: up to 2.6e-4 of a value off for NF4). The decoded
  values are put back in k order in registers (tl.join), so x is read in its own order, 16
  bytes a load.
Programs split K (SPLIT_K) when the tiles alone give too few programs; a second kernel sums the
fp32 partials. Which config, and whether at all (against dequantize + cuBLAS), is timed per
weight shape and row bucket at start-up (engine/quant/quant_choices.py); the caller passes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import interpreting
from engine.kernels.gemv import num_sms_for
from engine.kernels.launch_math import cdiv
from engine.kernels.ptx_decode import codes8_to_f32, table_words
from engine.kernels.wq_gemv import as_words

MAX_ROWS = 256
"""The most rows this kernel is timed for; more (prefill) dequantize and use cuBLAS."""


@triton.jit
def _load_step(
    k0,
    w_rows,
    x_rows,
    s_rows,
    n_mask,
    m_mask,
    k_end,
    IS_INT4: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    GROUP: tl.constexpr,
    WORDS: tl.constexpr,
):
    """The raw tiles of the K-step at k0: (weights, x [BLOCK_M, BLOCK_K], the int4 groups'
    scales [BLOCK_N, BLOCK_K / GROUP]); the weights int8 [BLOCK_N, BLOCK_K], or int4's int32
    words [BLOCK_N, BLOCK_K / 8] (WORDS) or bytes [BLOCK_N, BLOCK_K / 2] (column 2j in byte
    j's high nibble, 2j + 1 in its low one). With whole tiles, a step at or past k_end (the one
    AHEAD loads after the last) reads the last tile again, unmasked."""
    if IS_INT4 or EVEN_K:
        k0 = tl.minimum(k0, k_end - BLOCK_K)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if IS_INT4:
        if WORDS:
            offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        else:
            offs_w = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        w = tl.load(w_rows + offs_w[None, :], mask=n_mask[:, None], other=0)
        groups = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        s = tl.load(s_rows[:, None] + groups[None, :], mask=n_mask[:, None], other=0.0)
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None], other=0.0)
    elif EVEN_K:  # whole tiles: no mask along K
        w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0)
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None], other=0.0)
        s = n_mask  # unused
    else:
        k_mask = offs_k[None, :] < k_end
        w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask, other=0)
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask, other=0.0)
        s = n_mask  # unused
    return w, x, s


@triton.jit
def _multiply_step(
    acc, w, x, s, code_ptr, IS_INT4: tl.constexpr, GROUP: tl.constexpr, WORDS: tl.constexpr
):
    """acc [BLOCK_N, BLOCK_M] += the step's widened weights @ x.T."""
    if IS_INT4:  # each code's table value times its group's scale in fp32, rounded once
        if WORDS:  # in registers: 8 x [BLOCK_N, BLOCK_K / 8], codes k = 0..7 of each word
            w = _decode_words(w, code_ptr)
        else:  # from the table in L1: both codes of each byte
            packed = w.to(tl.int32)
            w = tl.join(tl.load(code_ptr + (packed >> 4)), tl.load(code_ptr + (packed & 0xF)))
        rows: tl.constexpr = w.shape[0]
        cols: tl.constexpr = x.shape[1]
        w = tl.reshape(w, (rows, s.shape[1], GROUP)) * s[:, :, None]
        w = tl.reshape(w, (rows, cols)).to(x.dtype)
        acc = tl.dot(w, tl.trans(x), acc)
    else:
        acc = tl.dot(w.to(x.dtype), tl.trans(x), acc)  # int8 is exact in 16 bits
    return acc


@triton.jit
def _decode_words(words, table_ptr):
    """[BLOCK_N, W] int32 words of eight codes -> their table values [BLOCK_N, W, 2, 2, 2] fp32
    in k order (ptx_decode.codes8_to_f32, the table's eight registers at table_ptr)."""
    c0, c1, c2, c3, c4, c5, c6, c7 = codes8_to_f32(
        words,
        tl.load(table_ptr),
        tl.load(table_ptr + 1),
        tl.load(table_ptr + 2),
        tl.load(table_ptr + 3),
        tl.load(table_ptr + 4),
        tl.load(table_ptr + 5),
        tl.load(table_ptr + 6),
        tl.load(table_ptr + 7),
    )
    # a join adds the last axis, so the first joins pick k's high bit: [.., p, q, r] = c[4p+2q+r]
    even = tl.join(tl.join(c0, c4), tl.join(c2, c6))
    return tl.join(even, tl.join(tl.join(c1, c5), tl.join(c3, c7)))


# M, the step's row count, only masks rows and offsets the split partials.
@triton.jit(do_not_specialize=["M"])
def _wq_gemm_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    code_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_wn,
    stride_sn,
    IS_INT4: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    AHEAD: tl.constexpr,
    EVEN_K: tl.constexpr,
    GROUP: tl.constexpr,
    WORDS: tl.constexpr,
):
    # Program (n, split, m) sums K-range `split` for an [BLOCK_N, BLOCK_M] tile of out.T; with
    # SPLIT_K > 1 it writes fp32 partials out[split, m, n], else the output itself. AHEAD loads
    # the next K-step's tiles into registers before this step's products (for one-stage
    # configs; Triton's pipelining, num_stages > 1, beat it for int8 on the H200).
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask, m_mask = offs_n < N, offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    s_rows = s_ptr + offs_n * stride_sn  # [BLOCK_N]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    rows = (w_rows, x_rows, s_rows, n_mask, m_mask, k_end)
    if AHEAD:
        w, x, s = _load_step(k_start, *rows, IS_INT4, BLOCK_K, EVEN_K, GROUP, WORDS)
        for k0 in range(k_start, k_end, BLOCK_K):
            w_next, x_next, s_next = _load_step(
                k0 + BLOCK_K, *rows, IS_INT4, BLOCK_K, EVEN_K, GROUP, WORDS
            )
            acc = _multiply_step(acc, w, x, s, code_ptr, IS_INT4, GROUP, WORDS)
            w, x, s = w_next, x_next, s_next
    else:
        for k0 in range(k_start, k_end, BLOCK_K):
            w, x, s = _load_step(k0, *rows, IS_INT4, BLOCK_K, EVEN_K, GROUP, WORDS)
            acc = _multiply_step(acc, w, x, s, code_ptr, IS_INT4, GROUP, WORDS)
    if not IS_INT4:
        acc *= tl.load(s_ptr + offs_n * stride_sn, mask=n_mask, other=0.0)[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        out = out_ptr + offs_m.to(tl.int64)[None, :] * N + offs_n[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        part = out_ptr + (pid_k * M + offs_m.to(tl.int64))[None, :] * N + offs_n[:, None]
        tl.store(part, acc, mask=mask)


@triton.jit(do_not_specialize=["MN"])
def _sum_splits_kernel(
    part_ptr,
    bias_ptr,
    out_ptr,
    MN,
    N,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):
        total += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def split_for(m: int, n: int, k: int, config: tuple, block_k: int, num_sms: int) -> int:
    """K splits so the grid has at least about two programs an SM, each at least 4 K-tiles."""
    block_n, block_m = config[0], config[1]
    programs = cdiv(n, block_n) * cdiv(m, block_m)
    want = max(1, (2 * num_sms) // programs)
    return max(1, min(want, k // (4 * block_k)))


def wq_gemm(
    x: torch.Tensor,  # [M, K], fp16 / bf16, unit stride along K
    qweight: torch.Tensor,  # int8 [N, K] or uint8 [N, K / 2]
    scales: torch.Tensor,  # fp32 [N] (int8) or [N, K / group] (int4)
    code: torch.Tensor | None,  # fp32 [16] (int4)
    bias: torch.Tensor | None,  # [N]
    group_size: int,
    config: tuple,  # (BLOCK_N, BLOCK_M, BLOCK_K or int4's groups, warps, stages, ahead[, words])
    num_sms: int | None = None,
) -> torch.Tensor:  # [M, N] in x's dtype
    """x @ dequant(qweight).T + bias; the caller checked the layer with supports()."""
    is_int4 = qweight.dtype == torch.uint8
    m, k = x.shape
    n = qweight.shape[0]
    block_n, block_m, block_k, warps, stages, ahead, *words = config
    w, table = qweight, code if is_int4 else scales
    if is_int4:  # whole groups a step, and whole steps (a ragged int4 tile is not masked)
        block_k = group_size * block_k if k % (group_size * block_k) == 0 else group_size
        # int4 words decode in registers (CUDA; the table's registers are read before any
        # capture: None sends the call to the table loads)
        lut = table_words(code) if words and words[0] and not interpreting() else None
        packed_words = as_words(qweight) if lut is not None else None
        if packed_words is not None:
            w, table = packed_words, lut
    split = split_for(m, n, k, config, block_k, num_sms_for(x, num_sms))
    k_per_split = cdiv(cdiv(k, split), block_k) * block_k
    split = cdiv(k, k_per_split)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else out
    grid = (cdiv(n, block_n), split, cdiv(m, block_m))
    _wq_gemm_kernel[grid](
        x,
        w,
        scales,
        table,
        bias if bias is not None else scales,
        part,
        m,
        n,
        k,
        k_per_split,
        x.stride(0),
        w.stride(0),
        scales.stride(0),
        IS_INT4=is_int4,
        SPLIT_K=split,
        HAS_BIAS=bias is not None,
        BLOCK_N=block_n,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        AHEAD=bool(ahead),
        EVEN_K=k % block_k == 0,
        GROUP=group_size if is_int4 else 1,
        WORDS=w.dtype == torch.int32,
        num_warps=warps,
        num_stages=stages,
    )
    if split > 1:
        _sum_splits_kernel[(cdiv(m * n, 1024),)](
            part,
            bias if bias is not None else out,
            out,
            m * n,
            n,
            SPLIT_K=split,
            HAS_BIAS=bias is not None,
            BLOCK=1024,
        )
    return out


def supports(qweight: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, group: int) -> bool:
    """The calls the kernel takes: 16-bit x of at most MAX_ROWS rows with a unit stride along
    K; unit-stride weights and scales; for int4 a group of at least 16 (a tensor-core K step
    of each byte half) that is a power of two and divides K."""
    if x.dtype not in (torch.float16, torch.bfloat16) or x.dim() != 2 or x.stride(-1) != 1:
        return False
    if not 1 <= x.shape[0] <= MAX_ROWS or qweight.stride(-1) != 1 or scales.stride(-1) != 1:
        return False
    if qweight.dtype == torch.uint8:
        k = 2 * qweight.shape[1]
        return group >= 32 and group & (group - 1) == 0 and k % group == 0 and x.shape[1] == k
    return qweight.dtype == torch.int8 and x.shape[1] == qweight.shape[1]


# kind -> row bucket -> candidate (BLOCK_N, BLOCK_M, BLOCK_K, num_warps, num_stages, ahead[,
# words]); a batch of M rows runs the config chosen for the smallest bucket >= M. int4's third
# field is scale groups a K-step; with words (CUDA) its codes decode in registers
# (ptx_decode.codes8_to_f32) and Triton pipelines the loads; without, the table loads in L1
# take one stage (Triton's pipelining turned them into asynchronous copies: 2% of the copy
# bandwidth). H200, 2026-11-30, bench_gemv --m 32 / --m 128, weight time of a decode step:
# int8 (64, 32, 128, 4, 4) 3.59 ms and (64, 128, 128, 4, 3) 5.58 ms, best on every shape
# (dequantize + cuBLAS 9.56 / 10.07; loading ahead in registers lost to Triton's pipelining);
# int4 words (64, 32, 2, 4, 3) 4.60 ms (table loads at best 7.72, dequantize + cuBLAS 15.00),
# (128, 128, 1, 8, 3) 8.27 ms at 128 rows (15.46).
CONFIGS = {
    "int8": {
        16: [(64, 16, 128, 4, 4, 0), (64, 16, 256, 4, 3, 0), (128, 16, 128, 8, 4, 0)],
        32: [(64, 32, 128, 4, 4, 0), (64, 32, 256, 4, 3, 0), (128, 32, 128, 8, 4, 0)],
        64: [(64, 64, 128, 4, 4, 0), (64, 64, 128, 4, 3, 0), (128, 64, 128, 8, 3, 0)],
        128: [(64, 128, 128, 4, 3, 0), (128, 128, 64, 8, 3, 0)],
        256: [(64, 128, 128, 4, 3, 0), (128, 128, 64, 8, 3, 0)],
    },
    "int4": {
        16: [(64, 16, 2, 4, 3, 0, 1), (128, 16, 2, 8, 3, 0, 1), (64, 16, 1, 4, 4, 0, 1)],
        32: [(64, 32, 2, 4, 3, 0, 1), (64, 32, 1, 4, 4, 0, 1), (128, 32, 2, 8, 3, 0, 1)],
        64: [(64, 64, 2, 4, 3, 0, 1), (128, 64, 2, 8, 3, 0, 1), (64, 64, 1, 4, 4, 0, 1)],
        128: [(64, 128, 1, 4, 3, 0, 1), (64, 128, 2, 4, 3, 0, 1), (128, 128, 1, 8, 3, 0, 1)],
        256: [(64, 128, 1, 4, 3, 0, 1), (64, 128, 2, 4, 3, 0, 1), (128, 128, 1, 8, 3, 0, 1)],
    },
}
BUCKETS = tuple(sorted(CONFIGS["int8"]))
"""Row buckets, the same for both kinds."""


def bucket_for(rows: int) -> int | None:
    """The smallest row bucket holding `rows`; None past MAX_ROWS."""
    return next((b for b in BUCKETS if rows <= b), None)
