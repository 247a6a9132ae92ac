"""INT8 KV cache: the quantization formula, the PyTorch reference against a 16-bit cache, and
the Triton kernels (store_kv, decode_attention, prefill_attention) with an int8 cache against
the reference: small shapes under Triton's CPU interpreter, real shapes on a GPU (-m gpu).

Dead cache slots hold random int8 and NaN scales (table padding points at such a block), so a
kernel that reads past a sequence's end dequantizes to NaN and fails the comparison.
"""

from __future__ import annotations

import pytest
import torch

from engine.kernels.torch_ref import (
    KV_SCALE_DTYPE,
    decode_attention_ref,
    dequantize_kv_ref,
    prefill_attention_ref,
    quantize_kv_ref,
    store_kv_ref,
)
from tests.support.paged_kv import paged_tables
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

DEVICE = "cuda" if HAS_CUDA else "cpu"
_store_mod, _, _, _decode_mod, _prefill_mod = import_kernel_modules(
    [
        ("store_kv", "_store_kv_kernel"),
        ("attention_variants", "soft_cap"),
        ("prefill_tiles", "attend_kv_tile"),
        ("decode_attention", "_decode_split_kernel"),
        ("prefill_attention", "_prefill_kernel"),
    ]
)
# Kernel vs reference on the same int8 cache (max abs error, outputs O(1)): as for 16-bit
# caches in test_kernels.py; bf16 also rounds p * v_scale before the PV matmul.
ATOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def paged_int8_kv(seq_lens, num_kv_heads, head_dim, block_size, gen, spare=2):
    """(k, v, k_scales, v_scales, tables): int8 caches on DEVICE holding quantized N(0, 1) K/V
    for the live tokens; block 0 is padding. The tensors are drawn on DEVICE (a generator
    seeded from `gen`): 8k-token contexts on the CPU took most of the GPU run's time."""
    num_blocks, tables, slots = paged_tables(seq_lens, block_size, gen, spare)
    slots = torch.tensor(slots, dtype=torch.long, device=DEVICE)
    dev_gen = torch.Generator(device=DEVICE).manual_seed(
        int(torch.randint(2**31, (1,), generator=gen))
    )
    out = []
    for _ in range(2):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        cache = torch.randint(-128, 128, shape, generator=dev_gen, device=DEVICE).to(torch.int8)
        scales = torch.full(cache.shape[:3], float("nan"), dtype=KV_SCALE_DTYPE, device=DEVICE)
        live = torch.randn(len(slots), num_kv_heads, head_dim, generator=dev_gen, device=DEVICE)
        q, s = quantize_kv_ref(live)
        cache.view(-1, num_kv_heads, head_dim)[slots] = q
        scales.view(-1, num_kv_heads)[slots] = s
        out.append((cache, scales))
    (k, ks), (v, vs) = out
    return k, v, ks, vs, tables.to(DEVICE)


def _dequant(cache, scales):
    # fp32 copy of an int8 cache (NaN where the scale is NaN) for the float reference path
    return dequantize_kv_ref(cache, scales).nan_to_num(0.0)


# ---------------------------------------------------------------- the formula, on the CPU


def test_quantize_roundtrip_within_half_a_step():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 4, 64, generator=gen) * torch.rand(50, 4, 1, generator=gen) * 10
    x[3, 1] = 0.0  # an all-zero row: scale 0, values 0, no NaN
    q, s = quantize_kv_ref(x)
    assert q.dtype == torch.int8 and s.dtype == KV_SCALE_DTYPE and s.shape == (50, 4)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    err = (dequantize_kv_ref(q, s) - x).abs()
    assert bool((err <= s.float()[..., None] * 0.5 * 1.001 + 1e-7).all())
    assert float(s[3, 1]) == 0.0 and not q[3, 1].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_reference_attention_close_to_16bit_cache(dtype):
    """Stated tolerance: with N(0, 1) q/K/V (head_dim 64, GQA 4, 300 tokens), attention over an
    int8 cache is within 3e-2 (max abs) of the fp32 cache's output (the first positions average
    few V rows, each off by up to max|v| / 254 ~ 0.015), and its mean error is at most 5x a
    bf16 cache's."""
    gen = torch.Generator().manual_seed(1)
    num_heads, num_kv_heads, head_dim, block_size, length = 8, 2, 64, 16, 300
    num_blocks = -(-length // block_size)
    k = torch.randn(length, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(length, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(length, num_heads, head_dim, generator=gen)
    slots, table = torch.arange(length), torch.arange(num_blocks, dtype=torch.int32)[None]
    scale = head_dim**-0.5

    def attend(cache_dtype):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        kc, vc = torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype)
        ks = vs = None
        if cache_dtype == torch.int8:
            ks, vs = (torch.zeros(shape[:3], dtype=KV_SCALE_DTYPE) for _ in range(2))
        store_kv_ref(k, v, kc, vc, slots, ks, vs)
        qd = q.to(dtype)
        prefill = prefill_attention_ref(qd, kc, vc, table, [0, length], [length], scale, ks, vs)
        lens = torch.tensor([length], dtype=torch.int32)
        decode = decode_attention_ref(qd[-1:], kc, vc, table, lens, scale, ks, vs)
        return prefill.float(), decode.float()

    (ref_p, ref_d), (p8, d8), (pb, _) = (
        attend(torch.float32),
        attend(torch.int8),
        attend(torch.bfloat16),
    )
    tol = 3e-2 if dtype == torch.float32 else 5e-2  # bf16 queries round the output too
    torch.testing.assert_close(p8, ref_p, atol=tol, rtol=0)
    torch.testing.assert_close(d8, ref_d, atol=tol, rtol=0)
    torch.testing.assert_close(d8[0], p8[-1], atol=tol, rtol=0)  # decode == last prefill row
    if dtype == torch.float32:
        assert (p8 - ref_p).abs().mean() <= 5 * (pb - ref_p).abs().mean()


# ---------------------------------------------------------------- Triton kernels


@pytest.mark.parametrize("src_dtype,head_dim", [(torch.float32, 64), (torch.bfloat16, 80)])
def test_store_kv_int8_matches_reference_and_skips_padding(src_dtype, head_dim):
    gen = torch.Generator().manual_seed(2)
    num_tokens, num_kv_heads, num_heads = 11, 2, 4
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen) * 3
    qkv = qkv.to(src_dtype).to(DEVICE)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    v = qkv[:, (num_heads + num_kv_heads) * head_dim :]
    k, v = k.view(num_tokens, num_kv_heads, head_dim), v.view(num_tokens, num_kv_heads, head_dim)
    k[4, 1] = 0.0  # all-zero row
    kv = torch.randint(-100, 100, (2, 5, 16, num_kv_heads, head_dim), generator=gen)
    kv = kv.to(torch.int8).to(DEVICE)
    scales = torch.rand(2, 5, 16, num_kv_heads, generator=gen).half().to(DEVICE)
    slots = torch.randperm(5 * 16, generator=gen)[:num_tokens]
    slots[[1, 6]] = -1  # CUDA-graph padding tokens
    slots = slots.to(DEVICE)
    expect_kv, expect_s = kv.clone(), scales.clone()
    live = slots >= 0
    store_kv_ref(k[live], v[live], *expect_kv, slots[live], *expect_s)
    _store_mod.store_kv(k, v, kv[0], kv[1], slots, scales[0], scales[1])
    assert torch.equal(scales, expect_s)
    # GPU division may round a value sitting on a .5 boundary the other way: one step at most
    diff = (kv.int() - expect_kv.int()).abs()
    assert int(diff.max()) <= (1 if HAS_CUDA else 0)


DECODE_CASES = [
    # head_dim, num_heads, num_kv_heads, block_size, dtype, num_splits
    (64, 2, 2, 16, torch.float32, None),
    (64, 8, 2, 16, torch.bfloat16, 3),
    (80, 4, 1, 32, torch.float16, 1),
]


def _check_decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, splits, gen):
    k, v, ks, vs, tables = paged_int8_kv(seq_lens, num_kv_heads, head_dim, block_size, gen)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim**-0.5
    out = _decode_mod.decode_attention(
        q, k, v, tables, lens, scale, num_splits=splits, k_scales=ks, v_scales=vs
    )
    live = lens > 0
    ref = decode_attention_ref(
        q[live].float(), _dequant(k, ks), _dequant(v, vs), tables[live], lens[live], scale
    )
    assert out.dtype == dtype
    torch.testing.assert_close(out[live].float(), ref, atol=ATOL[dtype], rtol=0)
    assert not out[~live].any()


@pytest.mark.parametrize("head_dim,num_heads,num_kv_heads,block_size,dtype,splits", DECODE_CASES)
def test_decode_attention_int8_matches_reference(
    head_dim, num_heads, num_kv_heads, block_size, dtype, splits
):
    gen = torch.Generator().manual_seed(head_dim + num_heads)
    seq_lens = [1, 0, block_size, 2 * block_size + 3, 150]
    _check_decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, splits, gen)


def _check_prefill(chunks, num_heads, num_kv_heads, head_dim, block_size, dtype, gen):
    """chunks: (q_len, seq_len) per sequence; seq_len - q_len tokens are a cached prefix."""
    seq_lens = [s for _, s in chunks]
    k, v, ks, vs, tables = paged_int8_kv(seq_lens, num_kv_heads, head_dim, block_size, gen)
    starts = [0]
    for q_len, _ in chunks:
        starts.append(starts[-1] + q_len)
    q = torch.randn(starts[-1], num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    scale = head_dim**-0.5
    out = _prefill_mod.prefill_attention(
        q,
        k,
        v,
        tables,
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        max(q for q, _ in chunks),
        scale,
        k_scales=ks,
        v_scales=vs,
    )
    ref = prefill_attention_ref(
        q.float(), _dequant(k, ks), _dequant(v, vs), tables, starts, seq_lens, scale
    )
    torch.testing.assert_close(out.float(), ref, atol=ATOL[dtype], rtol=0)


@pytest.mark.parametrize(
    "head_dim,num_heads,num_kv_heads,block_size,dtype",
    [(64, 2, 2, 16, torch.float32), (64, 8, 2, 16, torch.bfloat16), (80, 4, 1, 32, torch.float16)],
)
def test_prefill_attention_int8_matches_reference(
    head_dim, num_heads, num_kv_heads, block_size, dtype
):
    gen = torch.Generator().manual_seed(head_dim * num_heads)
    chunks = [(1, 1), (block_size, block_size), (37, 37), (5, 2 * block_size + 5), (1, 90)]
    _check_prefill(chunks, num_heads, num_kv_heads, head_dim, block_size, dtype, gen)


def test_int8_kernels_need_scales():
    q = torch.zeros(2, 4, 64, device=DEVICE)
    cache = torch.zeros(4, 16, 2, 64, dtype=torch.int8, device=DEVICE)
    tables = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="needs k_scales"):
        _decode_mod.decode_attention(q, cache, cache, tables, lens, 1.0)
    bad = torch.zeros(4, 16, 2, device=DEVICE)  # fp32, not fp16
    with pytest.raises(ValueError, match="k_scales must be"):
        _decode_mod.decode_attention(q, cache, cache, tables, lens, 1.0, k_scales=bad, v_scales=bad)
    with pytest.raises(ValueError, match="only for an int8 cache"):
        _store_mod.store_kv(
            q[:, :2], q[:, :2], cache.float(), cache.float(), lens.long(), bad.half(), bad.half()
        )


# ---------------------------------------------------------------- GPU, real shapes


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("splits", [None, 1])
def test_decode_attention_int8_gpu(dtype, group, head_dim, splits):
    gen = torch.Generator().manual_seed(group * head_dim)
    num_kv_heads = 8 if group > 1 else 16
    seq_lens = torch.randint(1, 8193, (24,), generator=gen).tolist() + [0, 1, 8192, 16]
    _check_decode(seq_lens, group * num_kv_heads, num_kv_heads, head_dim, 16, dtype, splits, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_attention_int8_gpu(dtype, group, head_dim):
    gen = torch.Generator().manual_seed(group + head_dim)
    chunks = [(1024, 1024), (512, 8192), (1, 300), (77, 77), (300, 4000)]
    _check_prefill(chunks, 8 * group, 8, head_dim, 16, dtype, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_store_kv_int8_gpu_real_shape(dtype):
    gen = torch.Generator().manual_seed(5)
    k = (torch.randn(4096, 8, 128, generator=gen) * 4).to(dtype).cuda()
    v = torch.randn(4096, 8, 128, generator=gen).to(dtype).cuda()
    kv = torch.zeros(2, 300, 16, 8, 128, dtype=torch.int8, device="cuda")
    scales = torch.zeros(2, 300, 16, 8, dtype=KV_SCALE_DTYPE, device="cuda")
    slots = torch.randperm(300 * 16, generator=gen)[:4096].cuda()
    expect_kv, expect_s = kv.clone(), scales.clone()
    store_kv_ref(k, v, *expect_kv, slots, *expect_s)
    _store_mod.store_kv(k, v, kv[0], kv[1], slots, scales[0], scales[1])
    assert torch.equal(scales, expect_s)
    assert int((kv.int() - expect_kv.int()).abs().max()) <= 1
