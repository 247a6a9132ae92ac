"""ptx_decode.codes8_to_f32 in Triton operations the CPU interpreter runs (it cannot run inline
PTX), for tests of the kernels around it; the PTX itself is tested by tests/test_ptx_decode.py.
Import it with TRITON_INTERPRET=1 set (the decorators read the flag)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _byte(c, t0, t1, t2, t3):
    """Byte c % 4 of register c // 4 (of t0..t3): entry c's byte in that plane."""
    word = tl.where(c < 4, t0, tl.where(c < 8, t1, tl.where(c < 12, t2, t3)))
    return (word >> (8 * (c % 4))) & 0xFF


@triton.jit
def _entry(words, shift, t0, t1, t2, t3, t4, t5, t6, t7):
    """The fp16 table entry of the code at bit `shift` of each word, as fp32."""
    c = (words >> shift) & 0xF
    bits = _byte(c, t0, t1, t2, t3) | (_byte(c, t4, t5, t6, t7) << 8)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def codes8_to_f32(words, t0, t1, t2, t3, t4, t5, t6, t7):
    """As ptx_decode.codes8_to_f32: the eight codes of each word in k order; a little-endian
    word's nibbles, from the low end, are the codes of k = 1, 0, 3, 2, 5, 4, 7, 6."""
    return (
        _entry(words, 4, t0, t1, t2, t3, t4, t5, t6, t7),
        _entry(words, 0, t0, t1, t2, t3, t4, t5, t6, t7),
        _entry(words, 12, t0, t1, t2, t3, t4, t5, t6, t7),
        _entry(words, 8, t0, t1, t2, t3, t4, t5, t6, t7),
        _entry(words, 20, t0, t1, t2, t3, t4, t5, t6, t7),
        _entry(words, 16, t0, t1, t2, t3, t4, t5, t6, t7),
        _entry(words, 28, t0, t1, t2, t3, t4, t5, t6, t7),
        _entry(words, 24, t0, t1, t2, t3, t4, t5, t6, t7),
    )
