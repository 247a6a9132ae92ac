"""MXFP4 weights (OCP Microscaling FP4, as gpt-oss ships its experts): dequantization at load
and gpt-oss's gate/up row order turned into our MoE layout.

The format: a weight [..., rows, cols] is stored as `*_blocks` uint8 [..., rows, cols / 32, 16]
and `*_scales` uint8 [..., rows, cols / 32]. Each byte holds two FP4 E2M1 codes, the low
nibble first (the even column), the high nibble second; a code is a sign bit and three bits
indexing 0, 0.5, 1, 1.5, 2, 3, 4, 6. Each run of 32 consecutive values along a row shares one
E8M0 scale byte s, the power of two 2^(s - 127); s = 255 is NaN in the format and refused.

gpt-oss's checkpoint holds, per MoE layer:
- `mlp.experts.gate_up_proj_blocks/_scales`: a weight [num_experts, 2 * inter, hidden] whose
  rows interleave the gate and the up projection (gate 0, up 0, gate 1, up 1, ...), and
  `gate_up_proj_bias` [num_experts, 2 * inter], interleaved the same way;
- `mlp.experts.down_proj_blocks/_scales`: a weight [num_experts, hidden, inter], and
  `down_proj_bias` [num_experts, hidden].
dequantize_mxfp4 gives these [E, rows, cols] weights (transformers' GptOssExperts holds their
transposes: gate_up_proj [E, hidden, 2 * inter], gate and up interleaved by column, and
down_proj [E, inter, hidden]). Our MoE layout (engine/kernels/moe_ref.py) wants w_gate_up
[E, 2 * inter, hidden] with the gate's rows first: gate_up_rows_first converts the blocks,
scales, bias or dequantized weight; w_down is the dequantized down weight as it is.
"""

from __future__ import annotations

import torch

BLOCK = 32
"""Values per E8M0 scale (16 bytes of two FP4 codes)."""
E8M0_NAN = 255
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The magnitudes of the eight FP4 E2M1 codes without their sign bit (bit 3)."""
ROWS_PER_CHUNK = 1 << 18
"""Blocks (32 values) dequantized at a time: the temporaries beyond the result take 200 bytes
a block (64 of int32 codes, 128 of fp32 values, 8 for the scale), 50 MiB by default."""
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _byte_table(device: torch.device) -> torch.Tensor:
    """[256, 2] fp32: a byte's two values, the low nibble's first."""
    codes = torch.tensor(FP4_E2M1, dtype=torch.float32)
    values = torch.cat([codes, -codes])  # [16]: bit 3 is the sign (code 8 is -0.0)
    byte = torch.arange(256)
    return torch.stack([values[byte & 0xF], values[byte >> 4]], dim=1).to(device)


def _scale_table(device: torch.device) -> torch.Tensor:
    """[256] fp32: 2^(s - 127) exactly, from its bit pattern (s = 0 is the subnormal 2^-127;
    the s = 255 entry, +inf, is never read: dequantize_mxfp4 refuses it first)."""
    s = torch.arange(256, dtype=torch.int32)
    bits = torch.where(s == 0, torch.tensor(1 << 22, dtype=torch.int32), s << 23)
    return bits.view(torch.float32).to(device)


def dequantize_mxfp4(
    blocks: torch.Tensor,
    scales: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    rows_per_chunk: int = ROWS_PER_CHUNK,
) -> torch.Tensor:
    """blocks uint8 [..., G, 16] and scales uint8 [..., G] -> [..., G * 32] in `dtype`, on the
    blocks' device: each value is its FP4 code times its block's 2^(s - 127), computed in fp32
    (exact: at most 3 significant bits) and rounded once to `dtype`, so values beyond its range
    become +-inf and tiny ones round to subnormals or zero, as transformers' own conversion
    does. Works through rows_per_chunk blocks at a time: the result plus ~50 MiB."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(
            f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}"
        )
    if blocks.dim() < 2 or blocks.shape[-1] != BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks must be [..., G, {BLOCK // 2}] with scales [..., G]; got "
            f"{tuple(blocks.shape)} and {tuple(scales.shape)}"
        )
    if dtype not in _DTYPES:
        raise ValueError(f"dequantize MXFP4 to one of {_DTYPES}, not {dtype}")
    if rows_per_chunk < 1:
        raise ValueError(f"rows_per_chunk must be positive, got {rows_per_chunk}")
    device = blocks.device
    byte_table, scale_table = _byte_table(device), _scale_table(device)
    flat_blocks = blocks.reshape(-1, BLOCK // 2)  # [rows, 16]
    flat_scales = scales.reshape(-1)  # [rows]
    out = torch.empty(flat_blocks.shape[0], BLOCK, dtype=dtype, device=device)  # [rows, 32]
    for start in range(0, flat_blocks.shape[0], rows_per_chunk):
        stop = start + rows_per_chunk
        chunk_scales = flat_scales[start:stop]
        if bool((chunk_scales == E8M0_NAN).any()):
            raise ValueError(
                f"MXFP4 scale byte {E8M0_NAN} (NaN in the E8M0 format) in the scales: the "
                "checkpoint is damaged or not MXFP4"
            )
        values = byte_table[flat_blocks[start:stop].int()]  # [n, 16, 2] fp32
        values *= scale_table[chunk_scales.int()][:, None, None]
        out[start:stop] = values.view(-1, BLOCK)  # rounded once to dtype
    return out.view(*blocks.shape[:-2], blocks.shape[-2] * BLOCK)


def gate_up_rows_first(t: torch.Tensor) -> torch.Tensor:
    """gpt-oss's interleaved gate/up rows (dim 1: gate 0, up 0, gate 1, up 1, ...) -> the gate's
    rows, then the up's (our w_gate_up and b_gate_up order). For any tensor with the
    [num_experts, 2 * inter, ...] shape: the blocks or scales before dequantizing (a quarter
    of the bytes to move), the bias, or a dequantized weight. A new contiguous tensor."""
    if t.dim() < 2 or t.shape[1] % 2:
        raise ValueError(
            f"gate/up rows must be [num_experts, 2 * inter, ...]; got {tuple(t.shape)}"
        )
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    inter = t.shape[1] // 2
    out[:, :inter] = t[:, 0::2]
    out[:, inter:] = t[:, 1::2]
    return out
