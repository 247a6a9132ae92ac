"""The inline-PTX weight decoders of engine/kernels/ptx_decode.py, run on the CPU through a
small interpreter of the PTX they use (Triton's interpreter cannot run inline assembly): every
int8 value, and every 4-bit code in every position of a word, against the reference decode."""

from __future__ import annotations

import random
import re
import struct

import pytest

pytest.importorskip("triton")

import math  # noqa: E402

import torch  # noqa: E402

from engine.kernels.ptx_decode import (  # noqa: E402
    DOT_BF16_TEXT,
    DOT_F16_TEXT,
    INT8X4_TEXT,
    NF4X8_TEXT,
    table_words,
)
from engine.quant.bnb import code_table  # noqa: E402

MASK = 0xFFFFFFFF


def _imm(text: str) -> int:
    if text.startswith("0f"):  # PTX's hex float literal: the fp32 bits
        return int(text[2:], 16)
    return int(text, 0) & MASK


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & MASK))[0]


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): result byte i is byte sel_i of the 8 bytes {b, a}; a
    selector's bit 3 replicates that byte's sign bit instead."""
    pool = (a & MASK) | (b & MASK) << 32
    out = 0
    for i in range(4):
        nib = sel >> (4 * i) & 0xF
        byte = pool >> (8 * (nib & 7)) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _half(bits: int, kind: str) -> float:
    if kind == "bf16":  # the high half of an fp32
        return _f32(bits << 16)
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def _to_half(value: float, kind: str) -> int:
    """value (exact in a double here) rounded to nearest-even in fp16 / bf16, as bits."""
    if kind == "f16":
        return struct.unpack("<H", struct.pack("<e", value))[0]  # rounds to nearest-even
    if value == 0:
        return 0
    m, e = math.frexp(value)  # value = m * 2^e, 0.5 <= |m| < 1; bf16 keeps 8 bits of m
    return _bits(round(m * 256) / 256 * 2.0**e) >> 16  # round(): to nearest-even


def _fma_x2(a: int, b: int, c: int, kind: str) -> int:
    """fma.rn.{f16,bf16}x2: per 16-bit lane, a * b + c rounded once."""
    out = 0
    for shift in (0, 16):
        lane = [v >> shift & 0xFFFF for v in (a, b, c)]
        exact = _half(lane[0], kind) * _half(lane[1], kind) + _half(lane[2], kind)
        out |= _to_half(exact, kind) << shift
    return out


def run_ptx(program: str, inputs: dict[int, int]) -> dict[str, int]:
    """Run the instruction subset the decoders use; registers hold unsigned bits."""
    regs = {f"${k}": v & MASK for k, v in inputs.items()}

    def val(tok: str) -> int:
        return regs[tok] if tok in regs else _imm(tok)

    for line in program.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # unpack two 16-bit halves
            lo, hi, src = re.match(r"\{(\w+), (\w+)\}, (\S+)", rest).groups()
            regs[lo], regs[hi] = val(src) & 0xFFFF, val(src) >> 16
            continue
        dst, *src = [t.strip() for t in rest.split(",")]
        x = [val(t) for t in src]
        if op == "and.b32":
            regs[dst] = x[0] & x[1]
        elif op == "or.b32":
            regs[dst] = x[0] | x[1]
        elif op == "xor.b32":
            regs[dst] = x[0] ^ x[1]
        elif op == "shr.b32":
            regs[dst] = x[0] >> x[1]
        elif op == "shl.b32":
            regs[dst] = x[0] << x[1] & MASK
        elif op in ("fma.rn.f16x2", "fma.rn.bf16x2"):
            regs[dst] = _fma_x2(*x, op.split(".")[2][:-2])
        elif op == "add.f32":
            regs[dst] = _bits(_f32(x[0]) + _f32(x[1]))  # exact in a double, then rounded
        elif op == "mov.b32":
            regs[dst] = x[0]
        elif op == "prmt.b32":
            regs[dst] = _prmt(x[0], x[1], x[2])
        elif op == "sub.f32":
            regs[dst] = _bits(_f32(x[0]) - _f32(x[1]))
        elif op == "cvt.f32.f16":  # exact: every fp16 value is an fp32 value
            regs[dst] = _bits(struct.unpack("<e", struct.pack("<H", x[0]))[0])
        else:
            raise AssertionError(f"instruction not modelled: {line}")
    return regs


def test_int8_word_decode_every_value():
    values = list(range(-128, 128))
    for start in range(0, 256, 4):
        ws = values[start : start + 4]
        word = int.from_bytes(bytes(v & 0xFF for v in ws), "little")
        regs = run_ptx(INT8X4_TEXT, {4: word})
        assert [_f32(regs[f"${i}"]) for i in range(4)] == [float(v) for v in ws]


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_code_word_decode_every_code_everywhere(quant_type):
    code = code_table(quant_type)
    table = table_words(code).tolist()
    want_table = code.half().float().tolist()  # the fp16-rounded values the PTX returns
    rng = random.Random(0)
    words = [int.from_bytes(bytes([c << 4 | c] * 4), "little") for c in range(16)]
    words += [rng.getrandbits(32) for _ in range(200)]
    for word in words:
        regs = run_ptx(NF4X8_TEXT, {8: word, **{9 + i: t for i, t in enumerate(table)}})
        packed = word.to_bytes(4, "little")  # byte j: code of k = 2j high, k = 2j + 1 low
        codes = [n for b in packed for n in (b >> 4, b & 0xF)]
        got = [_f32(regs[f"${k}"]) for k in range(8)]
        assert got == [want_table[c] for c in codes], hex(word)
    assert max(abs(a - b) for a, b in zip(want_table, code.tolist())) <= 2.6e-4


def _dot_case(kind: str, quant_type: str):
    code = code_table(quant_type)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float16
    table = table_words(code, dtype).tolist()
    return code.to(dtype).double().tolist(), {2 + i: t for i, t in enumerate(table)}


def _x_words(xs: list[float], kind: str) -> dict[int, int]:
    bits = [_to_half(v, kind) for v in xs]
    return {10 + j: bits[2 * j] | bits[2 * j + 1] << 16 for j in range(4)}


@pytest.mark.parametrize("kind", ["bf16", "f16"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_code_word_dot_picks_every_code_in_every_position(kind, quant_type):
    """x one-hot at k: the dot is table[code k] exactly (in x's type), for every code at
    every k, so the pair order, the selectors and the widening are all pinned."""
    rng = random.Random(1)
    want_table, table_regs = _dot_case(kind, quant_type)
    text = DOT_BF16_TEXT if kind == "bf16" else DOT_F16_TEXT
    words = [int.from_bytes(bytes([c << 4 | c] * 4), "little") for c in range(16)]
    words += [rng.getrandbits(32) for _ in range(40)]
    for word in words:
        codes = [n for b in word.to_bytes(4, "little") for n in (b >> 4, b & 0xF)]
        for k in range(8):
            x = [0.0] * 8
            x[k] = 1.0
            regs = run_ptx(text, {1: word, **table_regs, **_x_words(x, kind)})
            assert _f32(regs["$0"]) == want_table[codes[k]], (hex(word), k)


@pytest.mark.parametrize("kind,rel", [("bf16", 2.0**-8), ("f16", 2.0**-11)])
def test_code_word_dot_is_the_sum_within_its_rounding(kind, rel):
    """Random x: the packed sum is within four 16-bit rounding steps (each lane sums four
    products) of the exact sum of the same table values times x, scaled by the terms' size."""
    rng = random.Random(2)
    want_table, table_regs = _dot_case(kind, "nf4")
    text = DOT_BF16_TEXT if kind == "bf16" else DOT_F16_TEXT
    for _ in range(300):
        word = rng.getrandbits(32)
        codes = [n for b in word.to_bytes(4, "little") for n in (b >> 4, b & 0xF)]
        x = [_half(_to_half(rng.gauss(0, 3), kind), kind) for _ in range(8)]
        regs = run_ptx(text, {1: word, **table_regs, **_x_words(x, kind)})
        terms = [want_table[c] * v for c, v in zip(codes, x)]
        err = abs(_f32(regs["$0"]) - sum(terms))
        assert err <= 4 * rel * sum(abs(t) for t in terms) + 1e-30, (hex(word), x)
