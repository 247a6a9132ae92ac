"""Fused elementwise Triton kernels (rms_norm, apply_rope, silu_and_mul) against the PyTorch
layers in engine.models.layers: small shapes under Triton's CPU interpreter without CUDA,
larger model shapes (and a CUDA-graph capture) on a GPU.

The kernels round where PyTorch rounds, so 16-bit results may differ from the reference only
where reduction order (RMSNorm's mean) or exp's last bit (SiLU) flips a rounding; RoPE and the
residual sum are bit-identical.
"""

from __future__ import annotations

import pytest
import torch

from engine.models.layers import RMSNorm, silu_and_mul
from engine.models.rope_tables import RotaryEmbedding
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules

DEVICE = "cuda" if HAS_CUDA else "cpu"
LLAMA3_SCALING = dict(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


_norm_mod, _rope_mod, _silu_mod = import_kernel_modules(
    [("rmsnorm", "_rms_norm_kernel"), ("rope", "_rope_kernel"), ("silu_mul", "_silu_mul_kernel")]
)


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


GPU = pytest.mark.gpu  # the larger, real-model shapes
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Against the PyTorch layer run in the same dtype. The kernels round where it rounds, so what
# is left is reduction order (RMSNorm's mean) and exp/rsqrt's last bits: a few fp32 ulps, and
# at most 2 ulps of a 16-bit output when such a difference flips an intermediate rounding
# (measured under the interpreter: bf16 bit-identical, fp16 <= 2 ulps, fp32 <= 4 ulps).
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-5, rtol=2e-3),
    torch.bfloat16: dict(atol=1e-5, rtol=1.6e-2),
}


def _randn(*shape, gen, dtype):
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


def _norm_layer(hidden: int, dtype: torch.dtype, gen, eps: float = 1e-5) -> RMSNorm:
    layer = RMSNorm(hidden, eps)
    layer.weight.data = (1.0 + 0.5 * torch.randn(hidden, generator=gen)).to(dtype).to(DEVICE)
    return layer


# ---------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "num_tokens,hidden",
    [(1, 64), (7, 576), (33, 1536), (7, 4096), (1, 100)]
    + [
        pytest.param(t, h, marks=GPU)
        for t, h in [(1, 4096), (37, 5120), (4096, 4096), (300, 8192), (4096, 3584), (5, 1024)]
    ],
)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_layer(num_tokens, hidden, dtype, with_residual):
    gen = torch.Generator().manual_seed(hidden + num_tokens)
    layer = _norm_layer(hidden, dtype, gen)
    # x as a strided view: columns sliced from a wider buffer, so its row stride != hidden.
    x = _randn(num_tokens, hidden + 24, gen=gen, dtype=dtype)[:, 8 : 8 + hidden]
    residual = _randn(num_tokens, hidden, gen=gen, dtype=dtype) if with_residual else None
    x_before = x.clone()
    res_before = residual.clone() if with_residual else None
    got = _norm_mod.rms_norm(x, layer.weight, layer.eps, residual)
    expect = layer(x, residual)
    if with_residual:
        (got, got_res), (expect, expect_res) = got, expect
        assert torch.equal(got_res, expect_res)  # the residual sum rounds exactly as PyTorch
        assert torch.equal(residual, res_before)  # inputs are only read
    assert torch.equal(x, x_before)
    assert got.dtype == expect.dtype == dtype and got.shape == (num_tokens, hidden)
    torch.testing.assert_close(got, expect, **TOL[dtype])


def test_rms_norm_fp32_weight_on_bf16_input_promotes_like_pytorch():
    gen = torch.Generator().manual_seed(1)
    layer = _norm_layer(576, torch.float32, gen, eps=1e-6)
    x = _randn(7, 576, gen=gen, dtype=torch.bfloat16)
    got, expect = _norm_mod.rms_norm(x, layer.weight, layer.eps), layer(x)
    assert got.dtype == expect.dtype == torch.float32
    torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_per_head_on_strided_qkv_view(dtype):
    """Qwen3's q/k norm: [num_tokens, num_heads, head_dim] views sliced from a fused QKV."""
    gen = torch.Generator().manual_seed(2)
    num_tokens, num_heads, num_kv_heads, head_dim = 33, 4, 2, 32
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, gen=gen, dtype=dtype)
    q_size = num_heads * head_dim
    k = qkv[:, q_size : q_size + num_kv_heads * head_dim].view(num_tokens, num_kv_heads, -1)
    layer = _norm_layer(head_dim, dtype, gen, eps=1e-6)
    got = _norm_mod.rms_norm(k, layer.weight, layer.eps)
    assert got.shape == k.shape and got.is_contiguous()
    torch.testing.assert_close(got, layer(k), **TOL[dtype])


# ---------------------------------------------------------------- apply_rope

ROPE_CASES = [
    # num_tokens, num_heads, num_kv_heads, head_dim, scaling
    (1, 4, 2, 64, None),
    (7, 8, 2, 128, LLAMA3_SCALING),
    (33, 4, 4, 32, None),
    (7, 6, 2, 80, None),  # non-power-of-two head count and head_dim
    (70, 5, 1, 64, None),  # enough tokens for one program per token for all q (and all k) heads
] + [
    pytest.param(t, h, kv, 128, LLAMA3_SCALING, marks=GPU)
    for t, h, kv in [(1, 32, 8), (37, 32, 8), (4096, 32, 8), (4096, 16, 8), (300, 28, 4)]
]


def _qkv_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype, gen):
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, gen=gen, dtype=dtype)
    q, k, _ = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    return qkv, q.view(num_tokens, num_heads, head_dim), k.view(num_tokens, num_kv_heads, -1)


def _check_rope(num_tokens, num_heads, num_kv_heads, head_dim, scaling, dtype, max_pos, gen):
    rope = RotaryEmbedding(head_dim, max_pos, 500000.0, scaling).to(DEVICE)
    qkv, q, k = _qkv_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype, gen)
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen)
    positions[0] = max_pos - 1
    positions = positions.to(DEVICE)
    expect_q, expect_k = rope(positions, q, k)
    v_before = qkv[:, (num_heads + num_kv_heads) * head_dim :].clone()
    got_q, got_k = _rope_mod.apply_rope(q, k, positions, rope.cos, rope.sin)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()  # in place
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim :], v_before)
    # 16-bit: bit-identical (rounds exactly where the PyTorch version rounds)
    tol = TOL[dtype] if dtype == torch.float32 else dict(atol=0, rtol=0)
    torch.testing.assert_close(got_q, expect_q, **tol)
    torch.testing.assert_close(got_k, expect_k, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,num_heads,num_kv_heads,head_dim,scaling", ROPE_CASES)
def test_apply_rope_matches_layer_in_place_on_qkv_views(
    num_tokens, num_heads, num_kv_heads, head_dim, scaling, dtype
):
    gen = torch.Generator().manual_seed(num_tokens * head_dim + num_heads)
    _check_rope(num_tokens, num_heads, num_kv_heads, head_dim, scaling, dtype, 4096, gen)


# ---------------------------------------------------------------- silu_and_mul


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "num_tokens,intermediate",
    [(1, 64), (7, 576), (33, 1536), (7, 2500)]
    + [pytest.param(t, i, marks=GPU) for t, i in [(1, 14336), (37, 18944), (4096, 14336)]],
)
def test_silu_and_mul_matches_layer(num_tokens, intermediate, dtype):
    gen = torch.Generator().manual_seed(intermediate + num_tokens)
    # Strided rows: a slice of a wider buffer; scaled so silu sees its curved region and tails.
    x = (_randn(num_tokens, 2 * intermediate + 16, gen=gen, dtype=torch.float32) * 4).to(dtype)
    x = x[:, : 2 * intermediate]
    got = _silu_mod.silu_and_mul(x)
    expect = silu_and_mul(x)
    assert got.dtype == dtype and got.shape == (num_tokens, intermediate)
    torch.testing.assert_close(got, expect, **TOL[dtype])


def test_wrappers_reject_bad_arguments():
    norm, rope, silu = _norm_mod.rms_norm, _rope_mod.apply_rope, _silu_mod.silu_and_mul
    x, w = torch.zeros(3, 64), torch.ones(64)
    q, k = torch.zeros(3, 4, 64), torch.zeros(3, 2, 64)
    pos, cos = torch.zeros(3, dtype=torch.int64), torch.zeros(16, 64)
    cases = [
        (lambda: norm(x, w[:32], 1e-6), "rms_norm: weight must be"),
        (lambda: norm(x, w, 1e-6, x[:2]), "residual must match"),
        (lambda: norm(x, w, 1e-6, x.half()), "residual dtype"),
        (lambda: norm(torch.zeros(64, 3).t(), w, 1e-6), "rms_norm: x must have a unit-stride"),
        (lambda: norm(x.long(), w, 1e-6), "x must be fp16, bf16 or fp32"),
        (lambda: norm(torch.zeros(64), w, 1e-6), "rms_norm: x must be \\[num_tokens"),
        (lambda: rope(q, k[:2], pos, cos, cos), "apply_rope: q must be"),
        (lambda: rope(q, k, pos[:2], cos, cos), "positions must be \\[3\\]"),
        (lambda: rope(q, k, pos.float(), cos, cos), "positions must be contiguous int64"),
        (lambda: rope(q, k, pos, cos[:, :32], cos[:, :32]), "cos/sin must both be"),
        (lambda: rope(q, k, pos, cos.half(), cos.half()), "cos/sin must be fp32"),
        (lambda: rope(q, k.half(), pos, cos, cos), "q/k must share a float dtype"),
        (lambda: rope(q.mT.contiguous().mT, k, pos, cos, cos), "q must have a unit-stride"),
        (lambda: rope(k, k, pos, cos, cos), "q and k must be different tensors"),
        (lambda: silu(torch.zeros(3, 63)), "silu_and_mul: x must be \\[num_tokens"),
        (lambda: silu(torch.zeros(64, 3).t()), "silu_and_mul: x must have a unit-stride"),
        (lambda: silu(torch.zeros(3, 64, dtype=torch.int32)), "x must be fp16, bf16 or fp32"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_empty_batches_launch_nothing():
    w, cos = torch.ones(64), torch.zeros(8, 64)
    assert _norm_mod.rms_norm(torch.zeros(0, 64), w, 1e-6).shape == (0, 64)
    assert _silu_mod.silu_and_mul(torch.zeros(0, 128)).shape == (0, 64)
    q, k = torch.zeros(0, 4, 64), torch.zeros(0, 2, 64)
    assert _rope_mod.apply_rope(q, k, torch.zeros(0, dtype=torch.int64), cos, cos)[0] is q


# ---------------------------------------------------------------- GPU: CUDA graphs


@pytest.mark.gpu
@pytest.mark.gpu
def test_fused_kernels_replay_in_a_cuda_graph():
    """Captured once, replayed on new inputs written into the same buffers: no host sync or
    allocation during capture, and results follow the inputs."""
    gen = torch.Generator().manual_seed(5)
    bf16, hidden, inter, num_tokens = torch.bfloat16, 4096, 14336, 8
    layer = _norm_layer(hidden, bf16, gen)
    rope = RotaryEmbedding(128, 4096, 500000.0, LLAMA3_SCALING).to(DEVICE)
    x = _randn(num_tokens, hidden, gen=gen, dtype=bf16)
    res = _randn(num_tokens, hidden, gen=gen, dtype=bf16)
    gate_up = _randn(num_tokens, 2 * inter, gen=gen, dtype=bf16)
    _, q, k = _qkv_views(num_tokens, 32, 8, 128, bf16, gen)
    pos = torch.randint(0, 4096, (num_tokens,), generator=gen).to(DEVICE)

    def step():
        _rope_mod.apply_rope(q, k, pos, rope.cos, rope.sin)
        return _norm_mod.rms_norm(x, layer.weight, layer.eps, res), _silu_mod.silu_and_mul(gate_up)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (out, new_res), act = step()
    for t in (x, res, gate_up, q, k):
        t.copy_(torch.randn(t.shape, generator=gen).to(bf16))
    pos.copy_(torch.randint(0, 4096, (num_tokens,), generator=gen))
    expect_q, expect_k = rope(pos, q, k)
    expect_out, expect_res = layer(x, res)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q, expect_q) and torch.equal(k, expect_k)
    assert torch.equal(new_res, expect_res)
    torch.testing.assert_close(out, expect_out, **TOL[bf16])
    torch.testing.assert_close(act, silu_and_mul(gate_up), **TOL[bf16])
