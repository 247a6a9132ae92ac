"""Triton split-K GEMV for batch-1 decode with weight-only quantized weights:
out[1, N] = x[1, K] @ dequant(W).T (+ bias), in the layouts of engine/kernels/wq_gemv.py.

A batch-1 step reads every weight byte once, so this is a bandwidth kernel with as few
instructions per byte as possible (H200: about 16 bytes per SM clock):
- int8: no int->float conversion instruction (a quarter-rate op that capped the first kernel at
  about half the bandwidth); the byte is placed in the mantissa of 2^23 instead:
  float(w) = bits(0x4B000000 | (w ^ 0x80)) - (2^23 + 128), exact for every int8. The row
  scale multiplies the row's sum once.
- int4: one K-tile is one scale group (BLOCK_K = group size), so the group's absmax multiplies
  the tile's partial sums once per row, not each weight; x's even and odd entries come from one
  contiguous load, split in registers; the two 4-bit codes of a byte index the 16-entry table,
  which stays in L1.
Programs split K (SPLIT_K) when rows alone give too few programs; gemv.py's reduce kernel sums
the fp32 partials. Configs are chosen by timing on the device (engine.timing.fastest_config).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gemv import plan_split, reduce_split
from engine.kernels.launch_math import cdiv
from engine.timing import fastest_config

# kind -> (BLOCK_N, BLOCK_K, num_warps) candidates; int4's BLOCK_K is the group size (set per call)
CONFIGS = {
    "int8": [(16, 256, 4), (32, 128, 4), (8, 512, 4), (16, 512, 8), (8, 1024, 8), (4, 1024, 4)],
    "int4": [(32, 0, 4), (64, 0, 4), (16, 0, 2), (128, 0, 8), (256, 0, 8), (8, 0, 1)],
}
"""H200, 2026-11-29 (scripts/bench_gemv.py): (16, 512, 8) won every int8 Llama-3-8B shape but
qkv; int4 split between (128, 0, 8) and (16, 0, 2). The rest are untimed neighbours."""
MAGIC = tl.constexpr(0x4B000000)  # 2^23 as fp32 bits: low mantissa bits hold an integer


@triton.jit
def _wq_splitk_kernel(
    x_ptr, w_ptr, s_ptr, code_ptr, bias_ptr, out_ptr, part_ptr,
    N, K, stride_wn, stride_sn, k_per_split,
    IS_INT4: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if IS_INT4:
        HALF: tl.constexpr = BLOCK_K // 2
        acc = tl.zeros((BLOCK_N, HALF), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):  # one scale group per tile (K % BLOCK_K == 0)
            offs_j = k0 // 2 + tl.arange(0, HALF)
            packed = tl.load(w_rows + offs_j[None, :], mask=n_mask[:, None], other=0).to(tl.int32)
            w_even = tl.load(code_ptr + (packed >> 4))  # k = 2j: the high nibble
            w_odd = tl.load(code_ptr + (packed & 0xF))
            xk = tl.load(x_ptr + k0 + tl.arange(0, BLOCK_K)).to(tl.float32)
            x_even, x_odd = tl.split(tl.reshape(xk, (HALF, 2)))
            scale = tl.load(s_ptr + offs_n * stride_sn + k0 // BLOCK_K, mask=n_mask, other=0.0)
            acc += (w_even * x_even[None, :] + w_odd * x_odd[None, :]) * scale[:, None]
        partial = tl.sum(acc, axis=1)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < k_end
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
            u = w.to(tl.uint8, bitcast=True).to(tl.uint32)
            wf = ((u ^ 0x80) | MAGIC).to(tl.float32, bitcast=True) - 8388736.0  # 2^23 + 128
            x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            acc += wf * x[None, :]
        partial = tl.sum(acc, axis=1) * tl.load(s_ptr + offs_n * stride_sn, mask=n_mask, other=0.0)
    if SPLIT_K == 1:
        if HAS_BIAS:
            partial += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
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
    """One row through the split-K kernel; the caller (wq_gemv.wq_matmul) checked the inputs."""
    is_int4 = qweight.dtype == torch.uint8
    n, k = qweight.shape[0], x.shape[-1]
    block_n, block_k, warps = config
    if is_int4:
        block_k = group_size  # a power of two here (wq_matmul routes other groups elsewhere)
    split, k_per_split, out, part = plan_split(x, n, k, block_n, block_k, num_sms)
    b = bias if bias is not None else scales
    _wq_splitk_kernel[(cdiv(n, block_n), split)](
        x, qweight, scales, code if is_int4 else scales, b, out, part,
        n, k, qweight.stride(0), scales.stride(0), k_per_split,
        IS_INT4=is_int4, SPLIT_K=split, HAS_BIAS=bias is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )  # fmt: skip
    reduce_split(part, bias, out)
    return out


def supports(qweight: torch.Tensor, x: torch.Tensor, group_size: int) -> bool:
    """Shapes the split-K kernel takes: one row, contiguous x, and for int4 a power-of-two
    group of at least 16 (a K-tile is one group)."""
    if x.numel() != x.shape[-1] or x.stride(-1) != 1:
        return False
    if qweight.dtype == torch.uint8:
        return group_size >= 16 and group_size & (group_size - 1) == 0
    return True


Layer = tuple  # (qweight, scales, code or None, bias or None, group_size)
_choice: dict[tuple, tuple[int, int, int] | None] = {}
"""(kind, N, K, group, has bias, x dtype, device) -> the fastest config (None: none ran)."""


def _key(layer: Layer, dtype: torch.dtype) -> tuple:
    q, _, _, bias, group = layer
    return (q.dtype, *q.shape, group, bias is not None, dtype, q.device)


def choose_configs(layers: list[Layer], dtype: torch.dtype) -> None:
    """Time each candidate config per weight shape of `layers`, in a CUDA graph over all of
    that shape's weights (as a decode step reads them), and keep the fastest."""
    from engine.models.quant import wq_matmul_ref  # the reference, to reject a wrong config

    groups: dict[tuple, list[Layer]] = {}
    for layer in layers:
        groups.setdefault(_key(layer, dtype), []).append(layer)
    for key, same in groups.items():
        if key in _choice:
            continue
        q, s, code, bias, group = same[0]
        x = torch.randn(1, q.shape[1] * (2 if q.dtype == torch.uint8 else 1), dtype=dtype,
                        device=q.device)  # fmt: skip
        if not supports(q, x, group):
            continue
        ref = wq_matmul_ref(x, q, s, code, bias, group).float()

        def call(cfg, layer, x=x):
            return wq_gemv(x, *layer, cfg)

        _choice[key] = fastest_config(CONFIGS[_kind(q)], call, same, ref)
    torch.cuda.empty_cache()


def _kind(qweight: torch.Tensor) -> str:
    return "int4" if qweight.dtype == torch.uint8 else "int8"


def config_for(layer: Layer, x: torch.Tensor) -> tuple[int, int, int] | None:
    """The chosen config for this layer's shape; timed now (on this layer alone) if no choice
    was made before, or the first candidate while a CUDA graph is being captured. None: the
    split-K kernel does not take this call."""
    if not x.is_cuda or not supports(layer[0], x, layer[4]):
        return None
    key = _key(layer, x.dtype)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            return CONFIGS[_kind(layer[0])][0]
        choose_configs([layer], x.dtype)
    return _choice.get(key)
