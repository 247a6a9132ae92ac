"""Triton kernel of the causal depthwise conv1d over a packed batch, with each sequence's rolling
conv state read from and written back to its state-pool slot.

Same contract as engine/kernels/gdn_ref.py's causal_conv1d_varlen (layout in gdn_args.py).
One program per (sequence, BLOCK_C channels, token split) walks every num_splits-th block of
BLOCK_T of the sequence's tokens; each of the K taps loads its inputs from x, or, before the
sequence's first token here, from the slot's state (zeros when fresh). Only a sequence's first
block reads the old state (BLOCK_T >= K - 1), and split 0 owns it: after a barrier (its reads
of the old state done), split 0 stores the last K - 1 inputs: from x, and for a sequence
shorter than K - 1 tokens, the newest old entries first. Slot ids, fresh flags and
query_start_loc are read on the device (no host sync: CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gdn_args import check_batch, check_conv
from engine.kernels.launch_math import cdiv, next_power_of_2

# [8, 128] tiles: 153 registers a thread at 4 warps, no spills, built for sm_90 by Triton 3.6
# (as tests/support/gdn_sm90_compile.py builds it, then cuobjdump --dump-resource-usage);
# [16, 128] tiles took over 230.
BLOCK_C = 128
BLOCK_T = 8
MAX_SPLITS = 64
"""Token splits a sequence at most: a long prefill's conv_dim / BLOCK_C programs (64 at
Qwen3.5-27B's 8192 channels) times this fill the GPU."""


@triton.jit
def _conv_kernel(
    x_ptr,
    weight_ptr,
    bias_ptr,
    out_ptr,
    states_ptr,
    query_start_loc_ptr,
    slots_ptr,
    fresh_ptr,
    stride_xt,
    num_channels,
    KERNEL: tl.constexpr,
    BLOCK_W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    seq = tl.program_id(0)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < num_channels
    start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    end = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    is_fresh = tl.load(fresh_ptr + seq).to(tl.int1)
    # Slot and fresh flag fold into channel masks (Triton's interpreter takes no scalar in a
    # mask): no state read when fresh or padding, no store for padding.
    read_c = offs_c < tl.where((slot >= 0) & (is_fresh == 0), num_channels, 0)
    store_c = offs_c < tl.where((slot >= 0) & (split == 0), num_channels, 0)
    width = KERNEL - 1
    # [BLOCK_C] pointers to each channel's K - 1 state entries (oldest first)
    state_rows = states_ptr + (tl.maximum(slot, 0) * num_channels + offs_c) * width
    dtype = out_ptr.dtype.element_ty
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_C], dtype=tl.float32)
    for t0 in range(start + split * BLOCK_T, end, num_splits * BLOCK_T):
        rows = t0 + tl.arange(0, BLOCK_T)  # [BLOCK_T] packed token rows
        mask_tc = (rows < end)[:, None] & mask_c[None, :]
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32) + bias[None, :]
        for j in tl.static_range(KERNEL):
            source = rows - (KERNEL - 1) + j  # [BLOCK_T] the input this tap reads
            in_x = (source >= start)[:, None]
            x_ptrs = x_ptr + source[:, None] * stride_xt + offs_c[None, :]
            xs = tl.load(x_ptrs, mask=mask_tc & in_x, other=0.0)
            entry = (width + source - start)[:, None]  # its state column when before start
            olds = tl.load(
                state_rows[None, :] + entry, mask=mask_tc & (~in_x) & read_c[None, :], other=0.0
            )
            tap = tl.load(weight_ptr + offs_c * KERNEL + j, mask=mask_c, other=0.0)
            acc += (xs + olds).to(tl.float32) * tap.to(tl.float32)[None, :]
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        out_ptrs = out_ptr + rows[:, None] * num_channels + offs_c[None, :]
        tl.store(out_ptrs, acc.to(dtype), mask=mask_tc)
    # The new state: inputs end - K + 1 .. end - 1, from x or (short sequences) the old state
    offs_w = tl.arange(0, BLOCK_W)
    source = end - width + offs_w  # [BLOCK_W]
    in_x = (source >= start)[None, :]
    mask_cw = mask_c[:, None] & (offs_w < width)[None, :]
    xs = tl.load(
        x_ptr + source[None, :] * stride_xt + offs_c[:, None], mask=mask_cw & in_x, other=0.0
    )
    entry = (offs_w + (end - start))[None, :]
    olds = tl.load(state_rows[:, None] + entry, mask=mask_cw & (~in_x) & read_c[:, None], other=0.0)
    new_state = xs + olds  # [BLOCK_C, BLOCK_W]
    tl.debug_barrier()
    tl.store(state_rows[:, None] + offs_w[None, :], new_state, mask=mask_cw & store_c[:, None])


def causal_conv1d_varlen(
    x: torch.Tensor,  # [num_tokens, conv_dim]
    weight: torch.Tensor,  # [conv_dim, kernel]
    bias: torch.Tensor | None,  # [conv_dim]
    conv_states: torch.Tensor,  # [num_slots, conv_dim, kernel - 1], updated in place
    query_start_loc: torch.Tensor,  # [num_seqs + 1]
    slots: torch.Tensor,  # [num_seqs]
    fresh: torch.Tensor,  # [num_seqs] bool
    activation: str | None = "silu",
) -> torch.Tensor:  # [num_tokens, conv_dim] in x's dtype
    """gdn_ref.causal_conv1d_varlen on the GPU (or the interpreter). x's rows may be strided
    (unit-stride channels); weight, bias and conv_states contiguous."""
    check_conv(x, weight, bias, conv_states, activation)
    check_batch("causal_conv1d_varlen", x.shape[0], query_start_loc, slots, fresh, x.device)
    if x.stride(1) != 1:
        raise ValueError(f"causal_conv1d_varlen: x needs unit-stride channels, got {x.stride()}")
    for label, t in (("weight", weight), ("bias", bias), ("conv_states", conv_states)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"causal_conv1d_varlen: {label} must be contiguous")
    num_tokens, conv_dim = x.shape
    kernel = weight.shape[1]
    if kernel - 1 > BLOCK_T:
        raise ValueError(
            f"causal_conv1d_varlen: kernel width {kernel} is over {BLOCK_T + 1}, the widest "
            f"whose state only a sequence's first block of {BLOCK_T} tokens reads"
        )
    out = torch.empty(num_tokens, conv_dim, dtype=x.dtype, device=x.device)
    num_seqs = slots.shape[0]
    if num_seqs == 0:
        return out
    block_c = min(BLOCK_C, next_power_of_2(conv_dim))
    # Splits by the mean blocks a sequence (shapes only: the same for a captured graph's replays)
    num_splits = max(1, min(MAX_SPLITS, cdiv(cdiv(num_tokens, BLOCK_T), num_seqs)))
    _conv_kernel[(num_seqs, cdiv(conv_dim, block_c), num_splits)](
        x,
        weight,
        weight if bias is None else bias,
        out,
        conv_states,
        query_start_loc,
        slots,
        fresh,
        x.stride(0),
        conv_dim,
        KERNEL=kernel,
        BLOCK_W=next_power_of_2(kernel - 1),
        HAS_BIAS=bias is not None,
        SILU=activation == "silu",
        BLOCK_T=BLOCK_T,
        BLOCK_C=block_c,
        num_warps=4,
    )
    return out
