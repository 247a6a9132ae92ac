"""The tile helpers every MoE kernel shares (engine/kernels/moe.py's grouped GEMMs and
moe_gemv.py's few-token path): the experts' activation, one weight tile read as stored or
widened from int8 / int4, and the K step int4 tiles allow."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def act_and_mul(gate, up, ACTIVATION: tl.constexpr, LIMIT: tl.constexpr, ALPHA: tl.constexpr):
    """moe_ref.act_and_mul on fp32 tiles; ACTIVATION indexes moe_ref.ACTIVATIONS."""
    if ACTIVATION == 0:  # silu
        return gate * tl.sigmoid(gate) * up
    elif ACTIVATION == 1:  # gelu_tanh: 0.5 * (1 + tanh(z)) = sigmoid(2z)
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        return gate * tl.sigmoid(2.0 * z) * up
    else:  # swiglu_oai
        gate = tl.minimum(gate, LIMIT)
        up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        return (up + 1.0) * (gate * tl.sigmoid(gate * ALPHA))


@triton.jit
def weight_tile(
    rows,  # [BLOCK_N, 1] each weight row's start (int4: its bytes)
    s_rows,  # [BLOCK_N] each row's first scale group (WKIND 2)
    code_ptr,  # [16] fp32 int4 table (WKIND 2)
    k0,
    k_end,
    n_mask,  # [BLOCK_N]
    WKIND: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """The weights of columns k0 .. k0 + BLOCK_K of the rows, [BLOCK_N, BLOCK_K] in DOT_DTYPE:
    as stored (WKIND 0), int8 widened exactly (1; the row scale comes in the epilogue), or
    int4 (2): each code's table value times its group's scale in fp32, rounded once; whole
    groups a step and no mask along K (the wrapper's BLOCK_K divides K)."""
    if WKIND == 2:
        block_n: tl.constexpr = rows.shape[0]
        offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # column 2j in byte j's high nibble
        packed = tl.load(rows + offs_b[None, :], mask=n_mask[:, None], other=0).to(tl.int32)
        w = tl.join(tl.load(code_ptr + (packed >> 4)), tl.load(code_ptr + (packed & 0xF)))
        groups = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        s = tl.load(s_rows[:, None] + groups[None, :], mask=n_mask[:, None], other=0.0)
        w = tl.reshape(w, (block_n, BLOCK_K // GROUP, GROUP)) * s[:, :, None]
        return tl.reshape(w, (block_n, BLOCK_K)).to(DOT_DTYPE)
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = n_mask[:, None] & (offs_k[None, :] < k_end)
        return tl.load(rows + offs_k[None, :], mask=mask, other=0).to(DOT_DTYPE)


def block_k_for(block_k: int, cols: int, wkind: int, group: int) -> int:
    """The config's K step, or for int4 whole scale groups that divide the row (int4 tiles are
    not masked along K): the config's step where it does, else one group."""
    if wkind != 2:
        return block_k
    return block_k if block_k % group == 0 and cols % block_k == 0 else group
