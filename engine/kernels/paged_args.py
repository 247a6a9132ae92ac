"""Argument checks and launch helpers shared by the paged-attention kernels (decode_attention,
prefill_attention) and the decode GEMM: input validation, the output buffer, the tl.dot operand
dtype, and the first launch config that fits the device."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.kv_scales import check_kv_scales

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_paged_inputs(
    name: str,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> None:
    """Shared argument checks of the paged attention wrappers (raise ValueError)."""
    if q.dim() != 3 or q.stride(-1) != 1:
        raise ValueError(
            f"{name}: q must be [tokens, num_heads, head_dim] with a unit-stride "
            f"last dim, got shape {tuple(q.shape)} strides {q.stride()}"
        )
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"{name}: k_cache/v_cache must both be [num_blocks, block_size, "
            f"num_kv_heads, head_dim], got {tuple(k_cache.shape)} and "
            f"{tuple(v_cache.shape)}"
        )
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"{name}: q head_dim {head_dim} != cache head_dim {k_cache.shape[3]}")
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"{name}: num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}"
        )
    cache_dtypes = (*_DTYPES, torch.int8)
    if (
        q.dtype not in _DTYPES
        or k_cache.dtype not in cache_dtypes
        or v_cache.dtype != k_cache.dtype
    ):
        raise ValueError(
            f"{name}: q must be fp16/bf16/fp32 and the caches that or int8 (alike), got "
            f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    check_kv_scales(name, k_cache, k_scales, v_scales)
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError(
            f"{name}: k_cache/v_cache must share strides with a unit-stride last dim, got "
            f"{k_cache.stride()} and {v_cache.stride()}"
        )
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32 or block_tables.stride(1) != 1:
        raise ValueError(
            f"{name}: block_tables must be int32 [num_seqs, max_blocks] with "
            f"contiguous rows, got {block_tables.dtype} {tuple(block_tables.shape)}"
        )
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32 or not seq_lens.is_contiguous():
        raise ValueError(
            f"{name}: seq_lens must be contiguous int32 [num_seqs], got "
            f"{seq_lens.dtype} {tuple(seq_lens.shape)}"
        )
    if block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(
            f"{name}: block_tables has {block_tables.shape[0]} rows but seq_lens "
            f"has {seq_lens.shape[0]} entries"
        )
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, seq_lens)}
    if len(devices) != 1:
        raise ValueError(f"{name}: all tensors must be on one device, got {devices}")


def check_workspace(
    name: str,
    workspace: torch.Tensor,
    num_seqs: int,
    expected: tuple[int, ...],
    device: torch.device,
) -> None:
    """A split-K workspace must be contiguous fp32 [>= num_seqs, *expected] on `device`."""
    if (
        workspace.dtype != torch.float32
        or workspace.device != device
        or tuple(workspace.shape[1:]) != expected
        or workspace.shape[0] < num_seqs
        or not workspace.is_contiguous()
    ):
        raise ValueError(
            f"{name}: workspace must be contiguous fp32 [>={num_seqs}, "
            f"{', '.join(map(str, expected))}] on {device}, got "
            f"{workspace.dtype} {tuple(workspace.shape)} on {workspace.device}"
        )


def output_like(name: str, q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """`out` checked to match q's shape, dtype and device, or a new tensor like q."""
    if out is None:
        return torch.empty_like(q)
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(
            f"{name}: out must be {tuple(q.shape)} {q.dtype} on {q.device}, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    return out


def dot_dtype(dtype: torch.dtype, kernel: object) -> tl.dtype:
    """The dtype tl.dot operands are cast to: the input dtype, except bf16 under Triton's CPU
    interpreter (its tl.dot multiplies raw bf16 bit patterns), which computes in fp32."""
    if dtype == torch.float32:
        return tl.float32
    if dtype == torch.float16:
        return tl.float16
    return tl.bfloat16 if isinstance(kernel, triton.runtime.JITFunction) else tl.float32


_chosen: dict[tuple, dict] = {}


def launch_first_fitting(kernel, grid, configs: list[dict], *args, **constexprs) -> None:
    """Launch kernel with the first config (more constexprs + launch options) that fits the
    device's shared memory. The choice is remembered per kernel, constexprs, the dtypes of
    args[0] and args[1] (the query and the cache: the rest is int32 metadata, or fixed by the
    constexprs) and the device, so later calls (and CUDA-graph capture, after a warm-up call)
    go straight to it. Triton raises OutOfResources while loading the binary, before
    launching: a failed try is harmless."""
    q, cache = args[0], args[1]
    key = (kernel, tuple(constexprs.items()), q.dtype, cache.dtype, q.device)
    chosen = _chosen.get(key)
    if chosen is not None:
        kernel[grid](*args, **constexprs, **chosen)
        return
    for i, config in enumerate(configs):
        try:
            kernel[grid](*args, **constexprs, **config)
        except triton.runtime.errors.OutOfResources:
            if i == len(configs) - 1:
                raise
            continue
        _chosen[key] = config
        return
