"""The inline-PTX weight decoders of engine/kernels/ptx_decode.py, run on the CPU through a
small interpreter of the PTX they use (Triton's interpreter cannot run inline assembly): every
int8 value, and every 4-bit code in every position of a word, against the reference decode."""

from __future__ import annotations

import random
import re
import struct

import pytest

pytest.importorskip("triton")

from engine.kernels.ptx_decode import INT8X4_TEXT, NF4X8_TEXT, table_words  # noqa: E402
from engine.models.quant import code_table  # noqa: E402

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
