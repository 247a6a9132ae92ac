"""rope_store (RoPE then the KV-cache write in one launch) equals apply_rope then store_kv:
q, k and both caches bit for bit, padding slots untouched; under Triton's CPU interpreter, and
on a GPU for Llama-3-8B's heads."""

from __future__ import annotations

import pytest
import torch

from engine.models.rope_tables import RotaryEmbedding
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

DEVICE = "cuda" if HAS_CUDA else "cpu"
(_norm, _rope, _store, _fused) = import_kernel_modules(
    [
        ("rmsnorm", "_rms_norm_kernel"),
        ("rope", "_rope_kernel"),
        ("store_kv", "_store_kv_kernel"),
        ("rope_store", "_rope_store_kernel"),
    ]
)
GPU = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _case(num_tokens, num_heads, num_kv_heads, head_dim, dtype, cache_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=g)
    qkv = qkv.to(dtype).to(DEVICE)
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    views = (
        q.view(num_tokens, num_heads, head_dim),
        k.view(num_tokens, num_kv_heads, head_dim),
        v.view(num_tokens, num_kv_heads, head_dim),
    )
    block_size, num_blocks = 4, num_tokens + 3
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    slots[-1] = -1  # a CUDA-graph padding token: nothing stored
    cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    caches = (cache.to(cache_dtype).to(DEVICE), (cache + 1).to(cache_dtype).to(DEVICE))
    positions = torch.randint(0, 512, (num_tokens,), generator=g).to(DEVICE)
    return qkv, views, caches, slots.to(DEVICE), positions


CASES = [
    # num_tokens, num_heads, num_kv_heads, head_dim
    (1, 4, 2, 64),
    (5, 8, 2, 128),
    (3, 6, 2, 80),  # heads not a multiple of a program's 4, head_dim not a power of two
    (70, 5, 1, 64),  # enough tokens for one program per token for all heads
] + [pytest.param(t, 32, 8, 128, marks=GPU) for t in (1, 37, 256)]


@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
@pytest.mark.parametrize("num_tokens,num_heads,num_kv_heads,head_dim", CASES)
def test_rope_store_equals_rope_then_store(
    num_tokens, num_heads, num_kv_heads, head_dim, dtype, cache_dtype
):
    rope = RotaryEmbedding(head_dim, 512, 10000.0, None).to(DEVICE)
    qkv, (q, k, v), caches, slots, pos = _case(
        num_tokens, num_heads, num_kv_heads, head_dim, dtype, cache_dtype
    )
    qkv2 = qkv.clone()
    q2, k2, v2 = (
        t.view_as(s)
        for t, s in zip(qkv2.split([q[0].numel(), k[0].numel(), v[0].numel()], -1), (q, k, v))
    )
    caches2 = tuple(c.clone() for c in caches)
    _rope.apply_rope(q2, k2, pos, rope.cos, rope.sin)
    _store.store_kv(k2, v2, *caches2, slots)
    got_q, got_k = _fused.rope_store(q, k, v, pos, rope.cos, rope.sin, *caches, slots)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
    assert torch.equal(qkv, qkv2)  # q and k rotated in place, v untouched, as the two kernels
    assert torch.equal(caches[0], caches2[0]) and torch.equal(caches[1], caches2[1])


def test_rope_store_refuses_an_int8_cache_and_bad_shapes():
    rope = RotaryEmbedding(64, 512, 10000.0, None).to(DEVICE)
    _, (q, k, v), caches, slots, pos = _case(3, 4, 2, 64, torch.float32, torch.float32)
    int8 = tuple(c.to(torch.int8) for c in caches)
    with pytest.raises(ValueError, match="fp16, bf16 or fp32"):
        _fused.rope_store(q, k, v, pos, rope.cos, rope.sin, *int8, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        _fused.rope_store(q, k, v, pos, rope.cos, rope.sin, *caches, slots[:2])
    with pytest.raises(ValueError, match="positions"):
        _fused.rope_store(q, k, v, pos[:2], rope.cos, rope.sin, *caches, slots)


@pytest.mark.parametrize(
    "fused_seconds,wrong,kept", [(1.0, False, True), (3.0, False, False), (1.0, True, False)]
)
def test_choice_keeps_the_fused_kernel_only_when_equal_and_faster(
    monkeypatch, fused_seconds, wrong, kept
):
    """rope_store_wins with the device timing replaced (the two kernels: 2 s): the fused
    kernel is kept only when it equals the two bit for bit and is faster; the choice is
    recorded in the KernelChoices given, and a second call times nothing."""
    import engine.timing as timing
    from engine.startup.kernel_choices import KernelChoices, rope_store_wins

    real, calls = _fused.rope_store, []

    def fused(q, k, *args):
        calls.append(1)
        real(q, k, *args)
        if wrong:
            k.view(-1)[0] += 1.0  # one rotated value off
        return q, k

    def seconds(fn):  # graph_seconds, from who runs: the fused kernel or the two
        calls.clear()
        fn()
        return fused_seconds if calls else 2.0

    monkeypatch.setattr(_fused, "rope_store", fused)
    monkeypatch.setattr(timing, "graph_seconds", seconds)
    rope = RotaryEmbedding(64, 512, 10000.0, None).to(DEVICE)
    choices = KernelChoices()
    args = (4, 2, 64, torch.float32, rope.cos, rope.sin, 3)
    assert rope_store_wins(choices, *args) is kept
    assert choices.rope_store == {(4, 2, 64, torch.float32, rope.cos.device): kept}
    monkeypatch.setattr(timing, "graph_seconds", None)  # a second call must not time
    assert rope_store_wins(choices, *args) is kept


@pytest.mark.gpu
def test_choose_compares_and_times_on_the_device(monkeypatch):
    """With Llama-3-8B's heads on the device: the choice is made, each attention layer holds
    it, and a second call (a re-capture) keeps it without timing again."""
    import engine.timing as timing
    from engine.models.layers import PagedAttention
    from engine.startup.kernel_choices import KernelChoices, choose_rope_store

    rope = RotaryEmbedding(128, 4096, 500000.0, None).to(DEVICE)
    layers = [PagedAttention(32, 8, 128) for _ in range(4)]
    for layer in layers:
        layer.k_cache = layer.v_cache = torch.zeros(4, 16, 8, 128, dtype=torch.bfloat16).cuda()
    model = torch.nn.ModuleList([rope, *layers])
    choices = KernelChoices()
    choose_rope_store(model, choices)
    ((key, won),) = choices.rope_store.items()
    print(f"rope_store at one token, Llama-3-8B heads: {'fused' if won else 'two kernels'}")
    assert key == (32, 8, 128, torch.bfloat16, rope.cos.device)
    assert all(layer.fuse_rope_store is won for layer in layers)
    real, timed = timing.graph_seconds, []
    monkeypatch.setattr(timing, "graph_seconds", lambda fn: timed.append(fn) or real(fn))
    choose_rope_store(model, choices)
    assert not timed and all(layer.fuse_rope_store is won for layer in layers)


def test_engine_with_the_fused_kernel_generates_what_it_does_without(tiny_model, monkeypatch):
    """The model path: decode steps (and short prefills) through rope_and_store, under the
    interpreter here, give the greedy tokens of the plain path, prompt lengths across the
    64-token head split and the 512-token limit, padding-free CPU steps and several blocks
    per sequence."""
    from engine import LLM, SamplingParams
    from engine.models.layers import PagedAttention

    _, folder = tiny_model
    g = torch.Generator().manual_seed(3)
    groups = [
        [torch.randint(0, 256, (n,), generator=g).tolist() for n in ns]
        for ns in ((1, 9, 40, 70), (520,))
    ]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = LLM(str(folder), device="cpu", prefix_caching=False)  # the second pass computes all
    plain = [[o.token_ids for o in llm.generate(p, greedy)] for p in groups]
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, PagedAttention)]
    for layer in layers:
        layer.fuse_rope_store = True
    calls = []
    real = _fused.rope_store
    monkeypatch.setattr(_fused, "rope_store", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    fused = [[o.token_ids for o in llm.generate(p, greedy)] for p in groups]
    assert fused == plain
    assert 120 in calls and max(calls) < 512  # decode steps, a 120-token prefill; not 520
