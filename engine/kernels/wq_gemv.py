"""Triton split-K GEMV for batch-1 decode with weight-only quantized weights:
out[1, N] = x[1, K] @ dequant(W).T (+ bias), in the layouts of engine/quant/weight_format.py.

A batch-1 step reads every weight byte once, so this is a bandwidth kernel with as few
instructions per byte as possible (H200: about 16 bytes per SM clock):
- int8: no int->float conversion instruction (a quarter-rate op that capped the first kernel at
  about half the bandwidth); the byte is placed in the mantissa of 2^23 instead:
  float(w) = bits(0x4B000000 | (w ^ 0x80)) - (2^23 + 128), exact for every int8. On CUDA the
  weights are read as int32 words and one PTX byte permute per weight builds those bits (the
  element path Triton compiles took an extract and an OR, about 6 instructions per byte in all;
  the interpreter runs the element path). The row scale multiplies the row's sum once.
- int4: one K-tile is one scale group (BLOCK_K = group size); x's even and odd entries come
  from two strided loads (one load split in registers cost a shared-memory round trip and
  barriers in every iteration); the two 4-bit codes of a byte index the 16-entry table, which
  stays in L1. Those lookups bound it: two loads per byte (sm_90 SASS and ncu, H200). The word
  path instead decodes int32 words of eight codes against the table held in eight registers,
  by byte permutes (ptx_decode.py), where a config asks for it (CONFIGS).
Programs split K (SPLIT_K) when rows alone give too few programs; gemv.py's reduce kernel sums
the fp32 partials. Configs are chosen by timing on the device at start-up
(engine/quant/quant_choices.py); the caller passes the one chosen for the shape.
Launched with PDL where pdl.enabled: the first weight tile loads before gdc_wait.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from engine.kernels import interpreting, pdl
from engine.kernels.gemv import num_sms_for, plan_split, reduce_split, split_k_for, weight_tile
from engine.kernels.launch_math import cdiv
from engine.kernels.ptx_decode import codes8_dot, codes8_to_f32, int8x4_to_f32, table_words
from engine.kernels.rmsnorm import round_to

# kind -> (BLOCK_N, BLOCK_K, num_warps[, maxnreg]) candidates; int4's BLOCK_K is the group size
# (set per call), its second field the decode (below); maxnreg caps ptxas' registers per thread
CONFIGS = {
    "int8": [(8, 1024, 8), (4, 1024, 4), (8, 512, 4), (16, 1024, 8)],
    "int4": [
        (128, 2, 4, 128),
        (256, 2, 4),
        (256, 2, 8, 128),
        (128, 2, 8, 96),
        (256, 1, 8),
        (128, 0, 8),
    ],
}
"""int4's second field picks the decode (its K-tile is always the scale group): 0 loads both
codes of a byte from the table in L1; 1 decodes int32 words of eight codes in registers to
fp32 (ptx_decode.codes8_to_f32); 2 does that against a table in x's 16-bit type and sums each
word's eight products in packed 16-bit FMAs (ptx_decode.codes8_dot; fp32 x takes 1). 1 and 2
are CUDA only, else the table loads.

H200, 2026-11-30 (benchmarks/kernels/bench_gemv.py), int8 word path: (8, 1024, 8) won o, down,
(8, 512, 4) gate_up and lm_head, (16, 1024, 8) qkv; (16, 256, 4), (32, 128, 4), (32, 512, 8)
and (64, 128, 4) lost on every shape. Loads pipelined through shared memory (Triton num_stages
3-5) and K-tiles of several int4 groups were slower on every shape, and loading the next
group's int4 scales and x a step ahead gained nothing (2.71 against 2.65 ms of int4 GEMVs a
token); all three are gone.
int4, share of the copy bandwidth: the dot form (2) at (128, 2, 4, 128) won or tied every
shape (qkv 33%, o 26%, gate_up 39% against 40% at (256, 2, 4), down 38%, lm_head 46%). Without
the register cap, ptxas gave (128, 2, 8) 48 registers and copied the table from uniform
registers before each byte permute (a fifth of the loop, sm_90 SASS compiled here); the cap
removes the copies. The fp32 words (1) reached 23-33% and the table loads
(0) 14-20%."""
MAGIC = tl.constexpr(0x4B000000)  # 2^23 as fp32 bits: low mantissa bits hold an integer


@triton.jit
def _wq_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    code_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    N,
    K,
    stride_wn,
    stride_sn,
    k_per_split,
    IS_INT4: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    WORDS: tl.constexpr,
    SILU: tl.constexpr,
    DOT: tl.constexpr,
    BF16: tl.constexpr,
):
    # With PDL (engine/kernels/pdl.py) the first weight tile is loaded before gdc_wait, while
    # the kernel before may still run; x is read after it. Each loop step loads the next tile
    # before using this one.
    # SILU: W is a gate-and-up weight [2N, K] and out[1, N] = silu(gate) * up; a program's
    # BLOCK_N rows are BLOCK_N / 2 gate rows, then the up rows of the same outputs (SPLIT_K 1).
    if PDL:
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if SILU:
        HB: tl.constexpr = BLOCK_N // 2
        r = tl.arange(0, BLOCK_N)
        n_mask = pid_n * HB + r % HB < N
        offs_n = pid_n * HB + r % HB + (r // HB) * N  # gate row, or N + that row for up
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if IS_INT4 and WORDS:  # int32 words of eight codes, decoded in registers (ptx_decode.py)
        EIGHTH: tl.constexpr = BLOCK_K // 8
        acc = tl.zeros((BLOCK_N, EIGHTH), dtype=tl.float32)
        offs_e = tl.arange(0, EIGHTH)
        w_next = weight_tile(w_rows, k_start // 8 + offs_e, k_end // 8, n_mask)
        t0 = tl.load(code_ptr)  # the table's eight registers (ptx_decode.table_words)
        t1 = tl.load(code_ptr + 1)
        t2 = tl.load(code_ptr + 2)
        t3 = tl.load(code_ptr + 3)
        t4 = tl.load(code_ptr + 4)
        t5 = tl.load(code_ptr + 5)
        t6 = tl.load(code_ptr + 6)
        t7 = tl.load(code_ptr + 7)
        if PDL:
            gdc_wait()
        for k0 in range(k_start, k_end, BLOCK_K):  # one scale group per tile
            if DOT:  # x_ptr: x as int32 pairs; the table in x's type (ptx_decode.codes8_dot)
                xs = x_ptr + k0 // 2 + 4 * offs_e
                x0 = tl.load(xs)[None, :]
                x1 = tl.load(xs + 1)[None, :]
                x2 = tl.load(xs + 2)[None, :]
                x3 = tl.load(xs + 3)[None, :]
                dot = codes8_dot(w_next, t0, t1, t2, t3, t4, t5, t6, t7, x0, x1, x2, x3, BF16)
                w_next = weight_tile(w_rows, (k0 + BLOCK_K) // 8 + offs_e, k_end // 8, n_mask)
            else:
                f0, f1, f2, f3, f4, f5, f6, f7 = codes8_to_f32(
                    w_next, t0, t1, t2, t3, t4, t5, t6, t7
                )
                w_next = weight_tile(w_rows, (k0 + BLOCK_K) // 8 + offs_e, k_end // 8, n_mask)
                xs = x_ptr + k0 + 8 * offs_e  # x[k0 + 8e + i] pairs with f_i
                dot = f0 * tl.load(xs).to(tl.float32)[None, :]
                dot += f1 * tl.load(xs + 1).to(tl.float32)[None, :]
                dot += f2 * tl.load(xs + 2).to(tl.float32)[None, :]
                dot += f3 * tl.load(xs + 3).to(tl.float32)[None, :]
                dot += f4 * tl.load(xs + 4).to(tl.float32)[None, :]
                dot += f5 * tl.load(xs + 5).to(tl.float32)[None, :]
                dot += f6 * tl.load(xs + 6).to(tl.float32)[None, :]
                dot += f7 * tl.load(xs + 7).to(tl.float32)[None, :]
            scale = tl.load(s_ptr + offs_n * stride_sn + k0 // BLOCK_K, mask=n_mask, other=0.0)
            acc += dot * scale[:, None]
        partial = tl.sum(acc, axis=1)
    elif IS_INT4:
        HALF: tl.constexpr = BLOCK_K // 2
        acc = tl.zeros((BLOCK_N, HALF), dtype=tl.float32)
        offs_h = tl.arange(0, HALF)
        w_next = weight_tile(w_rows, k_start // 2 + offs_h, k_end // 2, n_mask)  # bytes
        if PDL:
            gdc_wait()
        for k0 in range(k_start, k_end, BLOCK_K):  # one scale group per tile (K % BLOCK_K == 0)
            packed = w_next.to(tl.int32)
            w_next = weight_tile(w_rows, (k0 + BLOCK_K) // 2 + offs_h, k_end // 2, n_mask)
            w_even = tl.load(code_ptr + (packed >> 4))  # k = 2j: the high nibble
            w_odd = tl.load(code_ptr + (packed & 0xF))
            x_even = tl.load(x_ptr + k0 + 2 * offs_h).to(tl.float32)
            x_odd = tl.load(x_ptr + k0 + 2 * offs_h + 1).to(tl.float32)
            scale = tl.load(s_ptr + offs_n * stride_sn + k0 // BLOCK_K, mask=n_mask, other=0.0)
            acc += (w_even * x_even[None, :] + w_odd * x_odd[None, :]) * scale[:, None]
        partial = tl.sum(acc, axis=1)
    elif WORDS:  # int8 read as int32 words of 4 weights (w_ptr and stride_wn in words)
        QUARTER: tl.constexpr = BLOCK_K // 4
        acc = tl.zeros((BLOCK_N, QUARTER), dtype=tl.float32)
        offs_q = tl.arange(0, QUARTER)
        w_next = weight_tile(w_rows, k_start // 4 + offs_q, k_end // 4, n_mask)
        if PDL:
            gdc_wait()
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_x = k0 + 4 * offs_q
            x_mask = offs_x < k_end
            w0, w1, w2, w3 = int8x4_to_f32(w_next)
            w_next = weight_tile(w_rows, (k0 + BLOCK_K) // 4 + offs_q, k_end // 4, n_mask)
            x0 = tl.load(x_ptr + offs_x, mask=x_mask, other=0.0).to(tl.float32)
            x1 = tl.load(x_ptr + offs_x + 1, mask=x_mask, other=0.0).to(tl.float32)
            x2 = tl.load(x_ptr + offs_x + 2, mask=x_mask, other=0.0).to(tl.float32)
            x3 = tl.load(x_ptr + offs_x + 3, mask=x_mask, other=0.0).to(tl.float32)
            acc += w0 * x0[None, :]  # one FMA each (a sum of four products costs two more)
            acc += w1 * x1[None, :]
            acc += w2 * x2[None, :]
            acc += w3 * x3[None, :]
        partial = tl.sum(acc, axis=1) * tl.load(s_ptr + offs_n * stride_sn, mask=n_mask, other=0.0)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        offs_t = tl.arange(0, BLOCK_K)
        w_next = weight_tile(w_rows, k_start + offs_t, k_end, n_mask)
        if PDL:
            gdc_wait()
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + offs_t
            k_mask = offs_k < k_end
            w = w_next
            w_next = weight_tile(w_rows, offs_k + BLOCK_K, k_end, n_mask)
            u = w.to(tl.uint8, bitcast=True).to(tl.uint32)
            wf = ((u ^ 0x80) | MAGIC).to(tl.float32, bitcast=True) - 8388736.0  # 2^23 + 128
            x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            acc += wf * x[None, :]
        partial = tl.sum(acc, axis=1) * tl.load(s_ptr + offs_n * stride_sn, mask=n_mask, other=0.0)
    if HAS_BIAS and SPLIT_K == 1:
        partial += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if SILU:  # rounded where the two steps (this GEMV, then silu_mul.py) round
        dtype = out_ptr.dtype.element_ty
        gate, up = tl.split(tl.trans(tl.reshape(partial, (2, HB))))
        gate = round_to(gate, dtype)
        act = round_to(gate / (1.0 + tl.exp(-gate)), dtype)
        offs_o = pid_n * HB + tl.arange(0, HB)
        res = round_to(act * round_to(up, dtype), dtype)
        tl.store(out_ptr + offs_o, res.to(dtype), mask=offs_o < N)
    elif SPLIT_K == 1:
        tl.store(out_ptr + offs_n, partial.to(out_ptr.dtype.element_ty), mask=n_mask)
    else:
        tl.store(part_ptr + pid_k * N + offs_n, partial, mask=n_mask)


def wq_gemv(
    x: torch.Tensor,  # [1, K], fp16 / bf16 (fp32 too)
    qweight: torch.Tensor,  # int8 [N, K] or uint8 [N, K / 2]
    scales: torch.Tensor,  # fp32 [N] (int8) or [N, K / group] (int4)
    code: torch.Tensor | None,  # fp32 [16] (int4)
    bias: torch.Tensor | None,
    group_size: int,
    config: tuple[int, int, int],
    num_sms: int | None = None,
) -> torch.Tensor:  # [1, N]
    """One row through the split-K kernel; the caller checked the call with supports()."""
    n, k = qweight.shape[0], x.shape[-1]
    block_k = _block_k(qweight, group_size, config)
    split, k_per_split, out, part = plan_split(x, n, k, config[0], block_k, num_sms)
    weight = (qweight, scales, code, bias, group_size)
    _launch(x, *weight, config, out, part, n, (cdiv(n, config[0]), split), k_per_split, False)
    reduce_split(part, bias, out)
    return out


def wq_gemv_silu(
    x: torch.Tensor,  # [1, K]
    qweight: torch.Tensor,  # a gate-and-up weight: [2I, K] (int8) or [2I, K / 2] (int4)
    scales: torch.Tensor,
    code: torch.Tensor | None,
    bias: torch.Tensor | None,  # [2I]
    group_size: int,
    config: tuple[int, int, int],  # BLOCK_N counts gate and up rows together
    num_sms: int | None = None,
) -> torch.Tensor | None:  # [1, I]
    """silu(x @ gate.T) * (x @ up.T) in one kernel, equal to silu_and_mul(wq_gemv(...)); None
    where the rows alone give too few programs (this fused form does not split K)."""
    n, k = qweight.shape[0] // 2, x.shape[-1]
    block_n, block_k = config[0], _block_k(qweight, group_size, config)
    if (
        qweight.shape[0] % 2
        or block_n < 2
        or split_k_for(2 * n, k, block_n, block_k, num_sms_for(x, num_sms)) > 1
    ):
        return None
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    weight = (qweight, scales, code, bias, group_size)
    _launch(x, *weight, config, out, out, n, (cdiv(n, block_n // 2), 1), k, True)
    return out


def _block_k(qweight: torch.Tensor, group_size: int, config: tuple[int, int, int]) -> int:
    # int4: a K-tile is one scale group, a power of two here (supports() refuses others)
    return group_size if qweight.dtype == torch.uint8 else config[1]


def _launch(
    x, qweight, scales, code, bias, group_size, config, out, part, n, grid, k_per_split, silu
) -> None:
    is_int4 = qweight.dtype == torch.uint8
    use_pdl = pdl.enabled(x)
    # int8 always reads words on CUDA; int4 where the config asks (its second field >= 1),
    # the dot form (2) where x is 16-bit
    want_words = x.is_cuda and not interpreting() and (not is_int4 or config[1] >= 1)
    words = as_words(qweight) if want_words else None
    dot = is_int4 and config[1] == 2 and _pairs_ok(x)
    # int4 words read the table as eight registers; None (a table first seen inside a
    # capture) sends this call to the table-load path
    lut = None
    if is_int4 and words is not None:
        lut = table_words(code, x.dtype if dot else torch.float16)
    if is_int4 and lut is None:
        words = None
    dot = dot and words is not None
    w = qweight if words is None else words
    table = scales if not is_int4 else code if lut is None else lut
    _wq_gemv_kernel[grid](
        x.view(torch.int32) if dot else x,
        w,
        scales,
        table,
        bias if bias is not None else scales,
        out,
        part,
        n,
        x.shape[-1],
        w.stride(0),
        scales.stride(0),
        k_per_split,
        IS_INT4=is_int4,
        SPLIT_K=grid[1],
        HAS_BIAS=bias is not None,
        BLOCK_N=config[0],
        BLOCK_K=_block_k(qweight, group_size, config),
        PDL=use_pdl,
        WORDS=words is not None,
        SILU=silu,
        DOT=dot,
        BF16=x.dtype == torch.bfloat16,
        num_warps=config[2],
        launch_pdl=use_pdl,
        **({"maxnreg": config[3]} if len(config) > 3 else {}),
    )


def _pairs_ok(x: torch.Tensor) -> bool:
    """x can be read as int32 words of two 16-bit values (the int4 dot form)."""
    return x.dtype in (torch.float16, torch.bfloat16) and x.storage_offset() % 2 == 0


def as_words(qweight: torch.Tensor) -> torch.Tensor | None:
    """int8 [N, K] or packed int4 [N, K / 2] viewed as int32 words (the kernels' word paths),
    or None where the rows are not whole aligned words."""
    if qweight.shape[1] % 4 or qweight.stride(0) % 4 or qweight.storage_offset() % 4:
        return None
    return qweight.view(torch.int32)


def supports(qweight: torch.Tensor, x: torch.Tensor, group_size: int) -> bool:
    """Shapes the split-K kernel takes: one row, contiguous x, and for int4 a power-of-two
    group of at least 16 (a K-tile is one group)."""
    if x.numel() != x.shape[-1] or x.stride(-1) != 1:
        return False
    if qweight.dtype == torch.uint8:
        return group_size >= 16 and group_size & (group_size - 1) == 0
    return True
