"""Triton kernels (store_kv, decode_attention, prefill_attention) against the PyTorch reference:
small shapes under Triton's CPU interpreter without CUDA, plus larger bf16 shapes on a GPU.

Every cache slot that does not hold a live token is NaN (and table padding points at an
all-NaN block), so a kernel that reads past a sequence's end or through padding shows NaN.
"""

from __future__ import annotations

import pytest
import torch

from engine.kernels.torch_ref import decode_attention_ref, prefill_attention_ref, store_kv_ref
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


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


# Max abs error against an fp32 reference (values are O(1)): fp32 exact up to reassociation;
# 16-bit inputs round the output (and, on GPU, the probabilities fed to the PV matmul).
ATOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, dtype, gen, spare=3):
    """Caches of NaN except live tokens; block tables drawn from a permuted pool (block 0 is
    the all-NaN padding block); one extra padding column per table."""
    num_blocks, tables, slots = paged_tables(seq_lens, block_size, gen, spare)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = []
    for _ in range(2):
        cache = torch.full(shape, float("nan"), dtype=dtype)
        live = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype)
        cache.view(-1, num_kv_heads, head_dim)[torch.tensor(slots, dtype=torch.long)] = live
        caches.append(cache.to(DEVICE))
    return caches[0], caches[1], tables.to(DEVICE)


def _ref32(cache: torch.Tensor) -> torch.Tensor:
    return cache.nan_to_num(0.0).float()


# ---------------------------------------------------------------- store_kv


@pytest.mark.parametrize(
    "src_dtype,cache_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float16),
    ],
)
def test_store_kv_matches_reference_and_skips_padding(src_dtype, cache_dtype):
    gen = torch.Generator().manual_seed(0)
    num_tokens, num_kv_heads, head_dim, num_heads = 13, 2, 64, 4
    # k and v as strided views of a fused QKV output, as the model produces them.
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    qkv = qkv.to(src_dtype).to(DEVICE)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    v = qkv[:, (num_heads + num_kv_heads) * head_dim :]
    k, v = k.view(num_tokens, num_kv_heads, head_dim), v.view(num_tokens, num_kv_heads, head_dim)
    k_cache = torch.randn(6, 16, num_kv_heads, head_dim, generator=gen).to(cache_dtype)
    k_cache, v_cache = k_cache.to(DEVICE), k_cache.flip(0).contiguous().to(DEVICE)
    slots = torch.randperm(6 * 16, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1  # CUDA-graph padding tokens
    slots = slots.to(DEVICE)
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    live = slots >= 0
    store_kv_ref(k[live], v[live], expect_k, expect_v, slots[live])
    _store_mod.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expect_k)
    assert torch.equal(v_cache, expect_v)


def test_store_kv_rejects_bad_arguments():
    k = torch.zeros(3, 2, 64)
    cache = torch.zeros(4, 16, 2, 64)
    slots = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="k/v must both be"):
        _store_mod.store_kv(k[:, :1], k[:, :1], cache, cache, slots)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        _store_mod.store_kv(k, k, cache, cache, slots[:2])
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        _store_mod.store_kv(k, k, cache, cache, slots.float())
    with pytest.raises(ValueError, match="unit-stride"):
        _store_mod.store_kv(k.transpose(1, 2).contiguous().transpose(1, 2), k, cache, cache, slots)


# ---------------------------------------------------------------- decode_attention

DECODE_CASES = [
    # head_dim, num_heads, num_kv_heads, block_size, dtype, num_splits (None: heuristic)
    (64, 2, 2, 16, torch.float32, None),
    (128, 4, 2, 32, torch.bfloat16, 3),
    (64, 8, 2, 16, torch.float16, 4),
    (32, 16, 2, 16, torch.bfloat16, 1),
    (256, 8, 1, 16, torch.float32, 2),
    (80, 7, 1, 32, torch.float32, 5),  # non-power-of-two head_dim and group
]


@pytest.mark.parametrize(
    "head_dim,num_heads,num_kv_heads,block_size,dtype,num_splits", DECODE_CASES
)
def test_decode_attention_matches_reference(
    head_dim, num_heads, num_kv_heads, block_size, dtype, num_splits
):
    gen = torch.Generator().manual_seed(head_dim + num_heads + block_size)
    # Ragged: 1 token, 0 (padding), exact block multiples, long enough for several splits.
    seq_lens = [1, 0, block_size, 2 * block_size, int(torch.randint(130, 200, (1,), generator=gen))]
    seq_lens += torch.randint(2, 100, (1,), generator=gen).tolist()
    _check_decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, num_splits, gen)


def _check_decode(
    seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, num_splits, gen, **kwargs
):
    k_cache, v_cache, tables = make_paged_kv(
        seq_lens, num_kv_heads, head_dim, block_size, dtype, gen
    )
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim**-0.5
    out = _decode_mod.decode_attention(
        q, k_cache, v_cache, tables, lens, scale, num_splits=num_splits, **kwargs
    )
    assert out.shape == q.shape and out.dtype == dtype
    live = lens > 0
    ref = decode_attention_ref(
        q[live].float(), _ref32(k_cache), _ref32(v_cache), tables[live], lens[live], scale
    )
    torch.testing.assert_close(out[live].float(), ref, atol=ATOL[dtype], rtol=0)
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))  # padding rows: zeros
    return out


def test_decode_attention_reuses_preallocated_workspace_and_out():
    """CUDA-graph style: fixed num_splits, a workspace for more sequences than this batch,
    reused with different lengths (stale partials must not leak), output written in place."""
    gen = torch.Generator().manual_seed(7)
    num_heads, num_kv_heads, head_dim, num_splits = 4, 2, 64, 4
    ws = _decode_mod.decode_workspace(8, num_heads, head_dim, num_splits, DEVICE)
    for seq_lens in ([200, 3, 64], [0, 17, 90, 1, 129]):
        out = torch.empty(len(seq_lens), num_heads, head_dim, device=DEVICE)
        got = _check_decode(
            seq_lens,
            num_heads,
            num_kv_heads,
            head_dim,
            16,
            torch.float32,
            num_splits,
            gen,
            workspace=ws,
            out=out,
        )
        assert got.data_ptr() == out.data_ptr()


def test_decode_attention_rejects_bad_arguments():
    q = torch.zeros(2, 4, 64)
    cache = torch.zeros(4, 16, 2, 64)
    tables = torch.zeros(2, 3, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    decode = _decode_mod.decode_attention
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        decode(q[:, :3], cache, cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="block_tables must be int32"):
        decode(q, cache, cache, tables.long(), lens, 1.0)
    with pytest.raises(ValueError, match="seq_lens must be contiguous int32"):
        decode(q, cache, cache, tables, lens.long(), 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        decode(q[..., :32], cache, cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="workspace must be"):
        decode(
            q,
            cache,
            cache,
            tables,
            lens,
            1.0,
            num_splits=2,
            workspace=_decode_mod.decode_workspace(2, 4, 64, 3, "cpu"),
        )


# ---------------------------------------------------------------- prefill_attention

PREFILL_CASES = [
    # head_dim, num_heads, num_kv_heads, block_size, dtype
    (64, 2, 2, 16, torch.float32),
    (128, 4, 2, 32, torch.bfloat16),
    (64, 8, 2, 16, torch.float16),
    (32, 16, 2, 32, torch.bfloat16),
    (80, 7, 1, 16, torch.float32),
]


def _check_prefill(chunks, num_heads, num_kv_heads, head_dim, block_size, dtype, gen):
    """chunks: (q_len, seq_len) per sequence; seq_len - q_len tokens are a cached prefix."""
    seq_lens = [s for _, s in chunks]
    k_cache, v_cache, tables = make_paged_kv(
        seq_lens, num_kv_heads, head_dim, block_size, dtype, gen
    )
    starts = [0]
    for q_len, _ in chunks:
        starts.append(starts[-1] + q_len)
    q = torch.randn(starts[-1], num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    scale = head_dim**-0.5
    out = _prefill_mod.prefill_attention(
        q,
        k_cache,
        v_cache,
        tables,
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        max(q for q, _ in chunks),
        scale,
    )
    ref = prefill_attention_ref(
        q.float(), _ref32(k_cache), _ref32(v_cache), tables, starts, seq_lens, scale
    )
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=ATOL[dtype], rtol=0)


@pytest.mark.parametrize("head_dim,num_heads,num_kv_heads,block_size,dtype", PREFILL_CASES)
def test_prefill_attention_matches_reference(head_dim, num_heads, num_kv_heads, block_size, dtype):
    gen = torch.Generator().manual_seed(head_dim * num_heads + block_size)
    chunks = [
        (1, 1),  # one-token prompt
        (block_size, block_size),  # exactly one block, no prefix
        (37, 37),  # fresh prompt, partial last block
        (5, 2 * block_size + 5),  # short chunk after a cached prefix
        (1, 90),  # a decode-shaped chunk
    ]
    # A chunk spanning 2+ query tiles (a tile holds 128 // group tokens) after a prefix.
    q_long = 140 // (num_heads // num_kv_heads) + int(torch.randint(8, (1,), generator=gen))
    chunks.append((q_long, q_long + 37))
    _check_prefill(chunks, num_heads, num_kv_heads, head_dim, block_size, dtype, gen)


def test_chunked_prefill_equals_one_shot_prefill():
    """store_kv + prefill in two chunks gives the outputs of one whole-prompt prefill."""
    gen = torch.Generator().manual_seed(3)
    num_heads, num_kv_heads, head_dim, block_size, length, split = 4, 2, 64, 16, 70, 45
    q = torch.randn(length, num_heads, head_dim, generator=gen).to(DEVICE)
    k = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    v = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    table = torch.tensor([[4, 1, 3, 0, 2]], dtype=torch.int32, device=DEVICE)
    slots = (
        table[0].long()[torch.arange(length, device=DEVICE) // block_size] * block_size
        + torch.arange(length, device=DEVICE) % block_size
    )

    def run(pieces):
        k_cache = torch.zeros(5, block_size, num_kv_heads, head_dim, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        outs = []
        for lo, hi in pieces:
            _store_mod.store_kv(k[lo:hi], v[lo:hi], k_cache, v_cache, slots[lo:hi])
            outs.append(
                _prefill_mod.prefill_attention(
                    q[lo:hi],
                    k_cache,
                    v_cache,
                    table,
                    torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE),
                    torch.tensor([hi], dtype=torch.int32, device=DEVICE),
                    hi - lo,
                    0.125,
                )
            )
        return torch.cat(outs)

    torch.testing.assert_close(
        run([(0, split), (split, length)]), run([(0, length)]), atol=1e-5, rtol=0
    )


def test_triton_available_follows_interpreter_flag(monkeypatch):
    from engine.kernels import triton_available

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_available()
    monkeypatch.delenv("TRITON_INTERPRET")
    assert triton_available() == HAS_CUDA


# ---------------------------------------------------------------- GPU, real model shapes


@pytest.mark.gpu
@pytest.mark.gpu
@pytest.mark.parametrize("num_heads,num_kv_heads", [(32, 8), (16, 8)])
@pytest.mark.parametrize("num_splits", [None, 1, 16])
def test_decode_attention_gpu_bf16(num_heads, num_kv_heads, num_splits):
    gen = torch.Generator().manual_seed(num_heads)
    seq_lens = torch.randint(1, 4097, (48,), generator=gen).tolist() + [0, 1, 4096, 16]
    _check_decode(seq_lens, num_heads, num_kv_heads, 128, 16, torch.bfloat16, num_splits, gen)


@pytest.mark.gpu
@pytest.mark.gpu
@pytest.mark.parametrize("num_heads,num_kv_heads", [(32, 8), (16, 8)])
def test_prefill_attention_gpu_bf16(num_heads, num_kv_heads):
    gen = torch.Generator().manual_seed(num_heads)
    chunks = [(1024, 1024), (512, 2048), (1, 300), (77, 77), (300, 1500)]
    _check_prefill(chunks, num_heads, num_kv_heads, 128, 16, torch.bfloat16, gen)


def test_launch_math_matches_triton():
    """The wrappers' plain-Python cdiv / next_power_of_2 give Triton's values."""
    import triton

    from engine.kernels.launch_math import cdiv, next_power_of_2

    for n in range(0, 4100):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64, 1000):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
