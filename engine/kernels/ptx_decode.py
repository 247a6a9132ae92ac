"""Weight decoding in inline PTX for the batch-1 quantized GEMV (engine/kernels/wq_gemv.py).

Triton compiles an element-wise decode of packed bytes into several integer instructions per
byte, and a 4-bit code-table lookup into a memory load per code; a batch-1 GEMV needs about
16 bytes per SM clock, so both cap it below the bandwidth (sm_90 SASS and ncu, H200). These
helpers decode a whole 32-bit word of packed weights with byte permutes (`prmt`), in registers:

- int8: four weights a word, each `prmt` + one subtraction (the 2^23 trick).
- int4 (NF4/FP4): eight codes a word, looked up in a 16-entry fp16 table held in eight
  registers (its low bytes in four, its high bytes in four). One `prmt` looks up four 3-bit
  indices at once in an 8-entry half; a second `prmt` picks, per code, the half its fourth bit
  names. The table's fp16 rounding moves a value by at most 2.6e-4 of it (NF4), well under the
  bf16 output's own rounding.
- int4, dot form: the same lookup against a table in x's 16-bit type leaves the eight values
  as four packed pairs, which multiply x's own pairs (x read as int32 words) by four packed
  16-bit FMAs; the word's dot product is then widened to fp32 once. That skips eight
  conversions and eight fp32 FMAs a word (the fp32 form's loop was about 56 instructions a
  word in sm_90 SASS). The price: a word's eight products are summed in x's type (two lanes
  of four), a rounding step per product: for bf16 about 2^-9 of the products' magnitudes,
  about the bf16 output's own rounding.

The PTX strings are plain text so tests can run them through a small interpreter on the CPU
(tests/test_ptx_decode.py): Triton's interpreter cannot run inline assembly.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

INT8X4_TEXT = """{
.reg .b32 t, m;
xor.b32 t, $4, 0x80808080;
mov.b32 m, 0x4B000000;
prmt.b32 $0, t, m, 0x7440;
prmt.b32 $1, t, m, 0x7441;
prmt.b32 $2, t, m, 0x7442;
prmt.b32 $3, t, m, 0x7443;
sub.f32 $0, $0, 0f4B000080;
sub.f32 $1, $1, 0f4B000080;
sub.f32 $2, $2, 0f4B000080;
sub.f32 $3, $3, 0f4B000080;
}"""
"""Outputs $0..$3: the int8 weights of bytes 0..3 of $4 as fp32. Each byte, its sign bit
flipped, goes under the exponent byte of 2^23 (0x4B): bits(2^23 + w + 128); subtracting
2^23 + 128 leaves w, exactly."""


def _lookup(first: int) -> str:
    """PTX looking four codes up in the table registers $first..$first+7 ($first..+3 hold the
    16 entries' low bytes, +4..+7 their high bytes; entry e at byte e % 4 of register e // 4):
    `wlo` and `whi` receive the low and high bytes of the four entries. The low 16 bits of `ws`
    hold the codes' 3-bit indices (nibble i, from the low end, for code i) and those of `wt`
    their half pickers (nibble i = i, plus 4 where code i is 8 or more); prmt reads only the
    low 16 bits of its selector."""
    t = [f"${first + i}" for i in range(8)]
    return f"""prmt.b32 wa, {t[0]}, {t[1]}, ws;
prmt.b32 wb, {t[2]}, {t[3]}, ws;
prmt.b32 wlo, wa, wb, wt;
prmt.b32 wa, {t[4]}, {t[5]}, ws;
prmt.b32 wb, {t[6]}, {t[7]}, ws;
prmt.b32 whi, wa, wb, wt;
"""


def _nf4_half(out: tuple[str, str, str, str]) -> str:
    """PTX for four codes (as in _lookup, table registers $9..$16): out[i] receives
    table[code i] as fp32."""
    return (
        _lookup(9)
        + f"""prmt.b32 wa, wlo, whi, 0x5140;
prmt.b32 wb, wlo, whi, 0x7362;
mov.b32 {{h0, h1}}, wa;
mov.b32 {{h2, h3}}, wb;
cvt.f32.f16 {out[0]}, h0;
cvt.f32.f16 {out[1]}, h1;
cvt.f32.f16 {out[2]}, h2;
cvt.f32.f16 {out[3]}, h3;
"""
    )


# A packed byte holds code k = 2j in its high nibble and k = 2j + 1 in its low one, so the
# nibbles of a little-endian word, from the low end, are the codes of k = 1, 0, 3, 2, 5, 4, 7, 6.
NF4X8_TEXT = (
    "{\n.reg .b32 ws, wt, wa, wb, wlo, whi;\n.reg .b16 h0, h1, h2, h3;\n"
    "and.b32 ws, $8, 0x77777777;\n"  # every code's 3-bit index
    "shr.b32 wt, $8, 1;\n"
    "and.b32 wt, wt, 0x44444444;\n"
    "or.b32 wt, wt, 0x32103210;\n"  # every code's half picker
    + _nf4_half(("$1", "$0", "$3", "$2"))
    + "shr.b32 ws, ws, 16;\nshr.b32 wt, wt, 16;\n"
    + _nf4_half(("$5", "$4", "$7", "$6"))
    + "}"
)
"""Outputs $0..$7: table[code of k = 0..7] as fp32 for the word $8 of eight 4-bit codes; inputs
$9..$16: the table registers of nf4_table_words."""


def _pairs(first: str, second: str) -> str:
    """PTX leaving the table values of four codes (as in _lookup, table registers $2..$9) as
    two packed 16-bit pairs in k order, `first` = (k0, k1) and `second` = (k2, k3), low half
    first."""
    return (
        _lookup(2)
        + f"""prmt.b32 {first}, wlo, whi, 0x4051;
prmt.b32 {second}, wlo, whi, 0x6273;
"""
    )


def _dot_text(kind: str) -> str:
    """Output $0: sum over k of table[code k] * x[k] as fp32, for the word $1 of eight codes;
    $2..$9 the table registers (in x's type `kind`, f16 or bf16); $10..$13 x[0..7] as four
    int32 words of two values each. Products summed in packed 16-bit lanes, then widened."""
    if kind == "bf16":  # a bf16 is the high half of the fp32 with the same value
        widen = "shl.b32 lo, p, 16;\nand.b32 hi, p, 0xFFFF0000;\nadd.f32 $0, lo, hi;\n"
    else:
        widen = "mov.b32 {h0, h1}, p;\ncvt.f32.f16 lo, h0;\ncvt.f32.f16 hi, h1;\n"
        widen += "add.f32 $0, lo, hi;\n"
    fma = f"fma.rn.{kind}x2"
    return (
        "{\n.reg .b32 ws, wt, wa, wb, wlo, whi, pa, pb, p, lo, hi;\n.reg .b16 h0, h1;\n"
        "and.b32 ws, $1, 0x77777777;\n"
        "shr.b32 wt, $1, 1;\n"
        "and.b32 wt, wt, 0x44444444;\n"
        "or.b32 wt, wt, 0x32103210;\n"
        + _pairs("pa", "pb")
        + "mov.b32 p, 0;\n"
        + f"{fma} p, pa, $10, p;\n{fma} p, pb, $11, p;\n"
        + "shr.b32 ws, ws, 16;\nshr.b32 wt, wt, 16;\n"
        + _pairs("pa", "pb")
        + f"{fma} p, pa, $12, p;\n{fma} p, pb, $13, p;\n"
        + widen
        + "}"
    )


DOT_BF16_TEXT = _dot_text("bf16")
DOT_F16_TEXT = _dot_text("f16")
INT8X4_PTX = tl.constexpr(INT8X4_TEXT)  # as constexprs, the jit functions below can read them
NF4X8_PTX = tl.constexpr(NF4X8_TEXT)
DOT_BF16_PTX = tl.constexpr(DOT_BF16_TEXT)
DOT_F16_PTX = tl.constexpr(DOT_F16_TEXT)


@triton.jit
def int8x4_to_f32(words):
    """The four int8 weights of each int32 word (bytes in memory order) as fp32. CUDA only."""
    return tl.inline_asm_elementwise(
        asm=INT8X4_PTX,
        constraints="=r,=r,=r,=r,r",
        args=[words],
        dtype=(tl.float32,) * 4,
        is_pure=True,
        pack=1,
    )


@triton.jit
def codes8_to_f32(words, t0, t1, t2, t3, t4, t5, t6, t7):
    """table[code] as fp32 for the eight 4-bit codes of each int32 word, in k order; t0..t7:
    the table registers (nf4_table_words, loaded once per program). CUDA only."""
    return tl.inline_asm_elementwise(
        asm=NF4X8_PTX,
        constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r,r",
        args=[words, t0, t1, t2, t3, t4, t5, t6, t7],
        dtype=(tl.float32,) * 8,
        is_pure=True,
        pack=1,
    )


@triton.jit
def codes8_dot(words, t0, t1, t2, t3, t4, t5, t6, t7, x0, x1, x2, x3, BF16: tl.constexpr):
    """sum over k of table[code k] * x[k] (fp32) for each int32 word of eight 4-bit codes: the
    table registers t0..t7 in x's 16-bit type (table_words(code, that type)), x0..x3 the
    word's eight x values as int32 pairs (bf16 if BF16, else fp16), shaped like words. CUDA
    only."""
    # a literal constraint string: Triton 3.6 (the H200's) does not fold an expression there
    return tl.inline_asm_elementwise(
        asm=DOT_BF16_PTX if BF16 else DOT_F16_PTX,
        constraints="=r,r,r,r,r,r,r,r,r,r,r,r,r,r",
        args=[words, t0, t1, t2, t3, t4, t5, t6, t7, x0, x1, x2, x3],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
"""(table address, device, dtype) -> (the table, kept so its memory is not reused; words): a
cache of constants derived from each table's values, not a choice (each engine's tables are
its own tensors, so its own entries)."""


def table_words(code: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor | None:
    """The 16-entry fp32 code table as the eight int32 registers codes8_to_f32 (fp16) and
    codes8_dot (fp16 or bf16: `dtype`) read: the values in `dtype`, low bytes in words 0..3
    and high bytes in words 4..7 (entry e at byte e % 4 of word e // 4), on code's device.
    Cached per table tensor; None for a table first seen while a CUDA graph is being
    captured (reading its values would sync the device)."""
    key = (code.data_ptr(), code.device, dtype)
    if key in _tables:
        return _tables[key][1]
    if code.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    words = _pack(tuple(code.float().cpu().tolist()), code.device, dtype)
    _tables[key] = (code, words)
    return words


@functools.cache
def _pack(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    bits = torch.tensor(values, dtype=dtype).view(torch.int16).to(torch.int32) & 0xFFFF
    planes = torch.cat([bits & 0xFF, bits >> 8]).view(8, 4)  # [low bytes x4, high bytes x4]
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32)
    words = (planes << shifts).sum(dim=1)  # int64 sums of the four shifted bytes
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.to(device)
