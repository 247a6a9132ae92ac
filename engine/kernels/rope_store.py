"""Triton kernel for RoPE on q and k followed by the KV-cache write, in one launch (rope_store):
apply_rope (rope.py) then store_kv (store_kv.py) with a 16-bit (or fp32) cache, equal to the two.

At batch 1 each is a tiny kernel whose cost is mostly launch and latency (H200, Llama-3-8B:
3.3 us for RoPE, 1.3 us for the store, 32 layers a token); one launch saves one of them. The
program layout is rope.py's: (token, j), q head blocks first, then k head blocks; a k block also
writes its rotated K rows and the matching V rows into the cache slot (skipped for slot -1,
CUDA-graph padding). Whether the engine uses it is decided on the device at start-up
(engine/startup/kernel_choices.py), after an exact comparison with the two kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import pdl
from engine.kernels.launch_math import next_power_of_2
from engine.kernels.rope import _check as check_rope
from engine.kernels.rope import _rope_one, cos_sin, heads_per_program, rotate
from engine.kernels.store_kv import _check as check_store

_CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# positions and slot_mapping: views into the step's upload buffer at token-count-dependent
# offsets, read one scalar a program (as in rope.py and store_kv.py).
@triton.jit(do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])
def _rope_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    stride_sin,
    stride_kc_block,
    stride_kc_offset,
    stride_kc_head,
    stride_vc_block,
    stride_vc_offset,
    stride_vc_head,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.enter(PDL)  # engine/kernels/pdl.py
    token = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    Q_BLOCKS: tl.constexpr = (NUM_Q_HEADS + HEADS - 1) // HEADS
    dtype = q_ptr.dtype.element_ty
    c1, c2, s1, s2 = cos_sin(
        pos_ptr, cos_ptr, sin_ptr, token, stride_cos, stride_sin, dtype, HALF, BLOCK_HALF
    )
    offs_d = tl.arange(0, BLOCK_HALF)
    dmask = offs_d < HALF
    if j < Q_BLOCKS:
        _rope_one(
            q_ptr,
            stride_qt,
            stride_qh,
            token,
            j * HEADS,
            c1,
            c2,
            s1,
            s2,
            NUM_Q_HEADS,
            HALF,
            HEADS,
            BLOCK_HALF,
        )
    else:
        offs_h = (j - Q_BLOCKS) * HEADS + tl.arange(0, HEADS)
        mask = (offs_h[:, None] < NUM_KV_HEADS) & dmask[None, :]
        k1 = k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
        x1 = tl.load(k1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(k1 + HALF, mask=mask, other=0.0).to(tl.float32)
        out1, out2 = rotate(x1, x2, c1, c2, s1, s2, dtype)  # k (and the cache) as apply_rope
        tl.store(k1, out1.to(dtype), mask=mask)  # in place, as apply_rope
        tl.store(k1 + HALF, out2.to(dtype), mask=mask)
        slot = tl.load(slot_ptr + token).to(tl.int64)
        # padding tokens (slot -1) write nothing: a tensor mask, as store_kv.py
        heads = tl.where(slot >= 0, NUM_KV_HEADS, 0)
        cmask = (offs_h[:, None] < heads) & dmask[None, :]
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        kc = (
            k_cache_ptr
            + block * stride_kc_block
            + offset * stride_kc_offset
            + offs_h[:, None] * stride_kc_head
            + offs_d[None, :]
        )
        cache_dtype = k_cache_ptr.dtype.element_ty
        tl.store(kc, out1.to(cache_dtype), mask=cmask)
        tl.store(kc + HALF, out2.to(cache_dtype), mask=cmask)
        v1 = v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
        vc = (
            v_cache_ptr
            + block * stride_vc_block
            + offset * stride_vc_offset
            + offs_h[:, None] * stride_vc_head
            + offs_d[None, :]
        )
        tl.store(vc, tl.load(v1, mask=cmask, other=0.0).to(cache_dtype), mask=cmask)
        v2 = tl.load(v1 + HALF, mask=cmask, other=0.0)
        tl.store(vc + HALF, v2.to(cache_dtype), mask=cmask)


def rope_store(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64 (or int32)
    cos: torch.Tensor,  # [max_positions, head_dim] fp32
    sin: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], 16-bit or fp32
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens]; slots < 0 are skipped
) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_rope(q, k, positions, cos, sin) then store_kv(k, v, k_cache, v_cache,
    slot_mapping), in one launch; returns (q, k), rotated in place. The same checks as the
    two; an int8 cache (with scales) is refused: use the two kernels there."""
    if k_cache.dtype not in _CACHE_DTYPES:
        raise ValueError(f"rope_store: the cache must be fp16, bf16 or fp32, got {k_cache.dtype}")
    check_rope(q, k, positions, cos, sin)
    check_store(k, v, k_cache, v_cache, slot_mapping, None, None)
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return q, k
    num_kv_heads = k.shape[1]
    heads, programs = heads_per_program(num_tokens, num_q_heads, num_kv_heads)
    use_pdl = pdl.enabled(q)
    _rope_store_kernel[(num_tokens, programs)](
        q,
        k,
        v,
        positions,
        cos,
        sin,
        k_cache,
        v_cache,
        slot_mapping,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        sin.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HALF=head_dim // 2,
        HEADS=heads,
        BLOCK_HALF=next_power_of_2(head_dim // 2),
        BLOCK_SIZE=k_cache.shape[1],
        PDL=use_pdl,
        num_warps=4 if heads > 4 else 1,
        launch_pdl=use_pdl,
    )
    return q, k
