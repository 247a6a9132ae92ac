"""The Triton paged-attention kernels with a layer's variant (sliding window, soft-cap, sinks)
against the PyTorch reference (engine/kernels/torch_ref.py): decode and prefill, each variant
and all three, windows shorter and longer than the context, crossing cache blocks, decode
splits and prefill key tiles, a cached prefix before a chunk, GQA, an int8 cache, fp32 and
bf16; small shapes under Triton's CPU interpreter without CUDA, 4k-token contexts on a GPU.

Every cache slot that holds no live token is NaN, and so is every live key that no query of
the call may see through its window: a kernel that reads a key outside the window (as a split
or a key tile that starts at 0 would) turns the output to NaN."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.torch_ref import decode_attention_ref, prefill_attention_ref
from engine.runner.forward_context import AttentionMetadata
from tests.support.paged_kv import paged_caches, reference_caches
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules
from tests.support.triton_versions import each_triton, run_under_triton

DEVICE = "cuda" if HAS_CUDA else "cpu"
_variants_mod, _tiles_mod, _decode_mod, _prefill_mod = import_kernel_modules(
    [
        ("attention_variants", "soft_cap"),
        ("prefill_tiles", "attend_kv_tile"),
        ("decode_attention", "_decode_split_kernel"),
        ("prefill_attention", "_prefill_kernel"),
    ]
)
# Max abs error against an fp32 reference on the same cache (outputs O(1)): as in
# tests/test_kernels.py; the soft-cap's exp2 form of tanh adds ~1e-6 in fp32.
ATOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _sinks(variant, num_heads, gen):
    """The variant's kwargs: sinks True becomes a [num_heads] tensor of logits around 0..2,
    comparable to the scores, so the sink takes a visible share."""
    kwargs = dict(variant)
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = (torch.rand(num_heads, generator=gen) * 2.0).to(DEVICE)
    return kwargs


def check_decode(seq_lens, shape, variant, gen, num_splits=None, int8=False, **launch):
    """shape: (head_dim, num_heads, num_kv_heads, block_size, dtype); launch: more keyword
    arguments of decode_attention (workspace, out)."""
    head_dim, num_heads, num_kv_heads, block_size, dtype = shape
    kwargs = _sinks(variant, num_heads, gen)
    window = kwargs.get("window")
    first_seen = [max(n - window, 0) if window else 0 for n in seq_lens]
    layout = (num_kv_heads, head_dim, block_size, dtype, gen, DEVICE, int8)
    k, v, ks, vs, tables = paged_caches(seq_lens, first_seen, *layout)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim**-0.5
    scales = dict(k_scales=ks, v_scales=vs)
    out = _decode_mod.decode_attention(
        q, k, v, tables, lens, scale, num_splits=num_splits, **scales, **kwargs, **launch
    )
    live = lens > 0
    rk, rv = reference_caches(k, v, ks, vs)
    ref = decode_attention_ref(q[live].float(), rk, rv, tables[live], lens[live], scale, **kwargs)
    torch.testing.assert_close(out[live].float(), ref, atol=ATOL[dtype], rtol=0)
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))  # padding rows: zeros
    return out


def check_prefill(chunks, shape, variant, gen, int8=False):
    """chunks: (q_len, seq_len) per sequence; seq_len - q_len tokens are a cached prefix."""
    head_dim, num_heads, num_kv_heads, block_size, dtype = shape
    kwargs = _sinks(variant, num_heads, gen)
    window = kwargs.get("window")
    seq_lens = [s for _, s in chunks]
    first_seen = [max(s - q - window + 1, 0) if window else 0 for q, s in chunks]
    layout = (num_kv_heads, head_dim, block_size, dtype, gen, DEVICE, int8)
    k, v, ks, vs, tables = paged_caches(seq_lens, first_seen, *layout)
    starts = [0]
    for q_len, _ in chunks:
        starts.append(starts[-1] + q_len)
    q = torch.randn(starts[-1], num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    scale = head_dim**-0.5
    metadata = (
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        max(q for q, _ in chunks),
    )
    out = _prefill_mod.prefill_attention(
        q, k, v, tables, *metadata, scale, k_scales=ks, v_scales=vs, **kwargs
    )
    rk, rv = reference_caches(k, v, ks, vs)
    ref = prefill_attention_ref(q.float(), rk, rv, tables, starts, seq_lens, scale, **kwargs)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=ATOL[dtype], rtol=0)


VARIANTS = [
    {"window": 7},
    {"softcap": 1.5},
    {"sinks": True},
    {"window": 20, "softcap": 3.0, "sinks": True},
]
# head_dim, num_heads, num_kv_heads, block_size, dtype
SHAPES = [(64, 8, 2, 16, torch.float32), (32, 4, 4, 16, torch.bfloat16)]
SMALL = (64, 4, 2, 16, torch.float32)
GPU_SHAPE = (128, 16, 8, 16, torch.bfloat16)


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_variants_match_reference(variant, shape, num_splits):
    gen = torch.Generator().manual_seed(len(str(variant)) + shape[0] + num_splits)
    # Shorter than, equal to and longer than the windows, block multiples, a padding row,
    # long enough for several splits of 64 keys.
    seq_lens = [1, 0, 7, 16, 21, 33, 150]
    check_decode(seq_lens, shape, variant, gen, num_splits)


@pytest.mark.parametrize("window", [1, 16, 70, 129, 4096])
def test_decode_window_lengths_against_splits(window):
    """Windows of one key, of one block, crossing split and block edges, and longer than every
    sequence; the heuristic split count (which looks at the window), and fixed ones."""
    gen = torch.Generator().manual_seed(window)
    seq_lens = [1, 15, 16, 17, 64, 65, 130, 200]
    for num_splits in (None, 5):
        check_decode(seq_lens, SMALL, {"window": window}, gen, num_splits)


def test_decode_variants_with_a_cuda_graph_workspace():
    """CUDA-graph style: a fixed split count, a workspace for more sequences than this batch
    reused with other lengths (stale partials must not leak), `out` written in place."""
    gen = torch.Generator().manual_seed(5)
    head_dim, num_heads, num_splits = SMALL[0], SMALL[1], 4
    ws = _decode_mod.decode_workspace(8, num_heads, head_dim, num_splits, DEVICE)
    variant = {"window": 40, "softcap": 2.0, "sinks": True}
    for seq_lens in ([200, 3, 64], [0, 17, 90, 1, 129]):
        out = torch.empty(len(seq_lens), num_heads, head_dim, device=DEVICE)
        got = check_decode(seq_lens, SMALL, variant, gen, num_splits, workspace=ws, out=out)
        assert got.data_ptr() == out.data_ptr()


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_variants_with_an_int8_cache(num_splits):
    gen = torch.Generator().manual_seed(11)
    variant = {"window": 30, "softcap": 2.5, "sinks": True}
    check_decode([1, 9, 31, 100], SHAPES[0], variant, gen, num_splits, int8=True)


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_prefill_variants_match_reference(variant, shape):
    head_dim, num_heads, num_kv_heads, block_size, dtype = shape
    gen = torch.Generator().manual_seed(len(str(variant)) + head_dim)
    chunks = [
        (1, 1),  # one-token prompt
        (block_size, block_size),  # one block, no prefix
        (37, 37),  # fresh prompt longer than the windows, partial last block
        (5, 2 * block_size + 5),  # a short chunk after a cached prefix
        (1, 90),  # a decode-shaped chunk
    ]
    check_prefill(chunks, shape, variant, gen)


@pytest.mark.parametrize("window", [1, 8, 40, 150, 300, 4096])
def test_prefill_window_tiles(window):
    """Query tiles of 32 tokens (group 4) over key tiles of 128: windows inside one key tile,
    across key tiles and query tiles, long enough that whole key tiles go unmasked between
    masked ones, and longer than every sequence; long chunks after long cached prefixes."""
    gen = torch.Generator().manual_seed(window)
    chunks = [(100, 100), (70, 420), (3, 260), (33, 33)]
    check_prefill(chunks, SHAPES[0], {"window": window}, gen)


def test_prefill_variants_with_an_int8_cache():
    gen = torch.Generator().manual_seed(13)
    variant = {"window": 24, "softcap": 2.5, "sinks": True}
    check_prefill([(40, 40), (9, 75), (1, 50)], SHAPES[0], variant, gen, True)


def test_chunked_prefill_across_the_window_edge_equals_one_shot():
    """store_kv + a windowed prefill in three chunks (the window's edge falls inside the later
    chunks) gives the outputs of one whole-prompt prefill."""
    gen = torch.Generator().manual_seed(3)
    num_heads, num_kv_heads, head_dim, block_size, length, window = 4, 2, 64, 16, 90, 24
    q = torch.randn(length, num_heads, head_dim, generator=gen).to(DEVICE)
    k = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    v = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    table = torch.tensor([[4, 1, 3, 0, 2, 5]], dtype=torch.int32, device=DEVICE)
    pos = torch.arange(length, device=DEVICE)
    slots = table[0].long()[pos // block_size] * block_size + pos % block_size

    def run(pieces):
        k_cache = torch.zeros(6, block_size, num_kv_heads, head_dim, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        outs = []
        for lo, hi in pieces:
            k_cache.view(-1, num_kv_heads, head_dim)[slots[lo:hi]] = k[lo:hi]
            v_cache.view(-1, num_kv_heads, head_dim)[slots[lo:hi]] = v[lo:hi]
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
                    window=window,
                )
            )
        return torch.cat(outs)

    torch.testing.assert_close(
        run([(0, 20), (20, 51), (51, length)]), run([(0, length)]), atol=1e-5, rtol=0
    )


# ---------------------------------------------------------------- the backend, bad input


def test_backend_passes_the_variant_to_both_kernels():
    """A mixed step (two decodes, two prefill chunks) through the Triton backend equals the
    PyTorch backend with the same variant, at a fixed split count as CUDA graphs run it."""
    from engine.runner.attention_backends import AttentionBackend
    from engine.runner.attention_triton import TritonBackend

    gen = torch.Generator().manual_seed(17)
    num_heads, num_kv_heads, head_dim = 4, 2, 32
    seq_lens, q_lens = [60, 9, 50, 30], [1, 1, 20, 30]
    layout = (num_kv_heads, head_dim, 16, torch.float32, gen, DEVICE)
    k, v, _, _, tables = paged_caches(seq_lens, [0] * 4, *layout)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1], num_heads, head_dim, generator=gen).to(DEVICE)
    variant = {"window": 12, "softcap": 2.0, "sinks": torch.rand(num_heads, generator=gen)}
    variant["sinks"] = variant["sinks"].to(DEVICE)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.int64, device=DEVICE),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables,
        num_decodes=2,
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
        decode_num_splits=3,
    )
    got = TritonBackend().attention(q, k, v, meta, 0.2, **variant)
    want = AttentionBackend().attention(
        q.cpu(), k.cpu(), v.cpu(), _on_cpu(meta), 0.2, **{n: _cpu(x) for n, x in variant.items()}
    )
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=0)


def _cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _on_cpu(meta: AttentionMetadata) -> AttentionMetadata:
    fields = {name: _cpu(value) for name, value in vars(meta).items()}
    return AttentionMetadata(**fields)


def test_bad_variants_are_rejected():
    q = torch.zeros(2, 4, 64)
    cache = torch.zeros(4, 16, 2, 64)
    tables = torch.zeros(2, 3, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    decode = _decode_mod.decode_attention
    with pytest.raises(ValueError, match="window must be a positive int"):
        decode(q, cache, cache, tables, lens, 1.0, window=0)
    with pytest.raises(ValueError, match="window must be a positive int"):
        decode(q, cache, cache, tables, lens, 1.0, window=8.0)
    with pytest.raises(ValueError, match="softcap must be a positive finite"):
        decode(q, cache, cache, tables, lens, 1.0, softcap=-1.0)
    with pytest.raises(ValueError, match=r"sinks must be a contiguous float tensor \[4\]"):
        decode(q, cache, cache, tables, lens, 1.0, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="sinks must be"):
        _prefill_mod.prefill_attention(
            q,
            cache,
            cache,
            tables,
            torch.tensor([0, 1, 2], dtype=torch.int32),
            lens,
            1,
            1.0,
            sinks=torch.zeros(4, dtype=torch.int32),
        )


# ---------------------------------------------------------------- GPU, real model shapes


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 1, 16])
@pytest.mark.parametrize(
    "variant",
    [{"window": 1024}, {"window": 128, "sinks": True}, {"window": 1024, "softcap": 50.0}],
    ids=str,
)
def test_decode_variants_gpu_bf16(variant, num_splits):
    """Gemma-3-like (window 1024, soft-cap 50) and gpt-oss-like (window 128, sinks) layers at
    contexts up to 4k; 16 splits as a CUDA-graph batch fixes them, with a workspace."""
    gen = torch.Generator().manual_seed(len(str(variant)))
    seq_lens = torch.randint(1, 4097, (40,), generator=gen).tolist() + [0, 1, 4096, 1024, 1025]
    launch = {}
    if num_splits == 16:
        launch["workspace"] = _decode_mod.decode_workspace(64, 16, 128, 16, DEVICE)
    check_decode(seq_lens, GPU_SHAPE, variant, gen, num_splits, **launch)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "variant",
    [{"window": 1024}, {"window": 128, "sinks": True}, {"window": 1024, "softcap": 50.0}],
    ids=str,
)
@pytest.mark.parametrize("head_dim", [128, 256])
def test_prefill_variants_gpu_bf16(variant, head_dim):
    gen = torch.Generator().manual_seed(len(str(variant)) + head_dim)
    chunks = [(4096, 4096), (512, 4096), (1, 3000), (77, 77), (1500, 2600)]
    check_prefill(chunks, (head_dim, *GPU_SHAPE[1:]), variant, gen)


@pytest.mark.gpu
def test_decode_variants_gpu_int8():
    gen = torch.Generator().manual_seed(23)
    seq_lens = torch.randint(1, 4097, (32,), generator=gen).tolist() + [4096]
    variant = {"window": 1024, "softcap": 30.0, "sinks": True}
    check_decode(seq_lens, (128, 32, 8, 16, torch.bfloat16), variant, gen, 16, int8=True)


# ---------------------------------------------------------------- sm_90 compile, no GPU


@each_triton
def test_variant_kernels_compile_for_sm90(triton_dir):
    """Every variant switch of both kernels compiles for sm_90 (Triton's bundled ptxas), with
    the venv's Triton and the H200's 3.6 (tests/support/attention_variants_compile.py)."""
    run = run_under_triton(
        triton_dir, ["-m", "tests.support.attention_variants_compile"], timeout=600
    )
    variants = int(run.stdout.split("variants: ")[-1])
    assert variants >= 10 and run.stdout.count("ok ") == variants, run.stdout
