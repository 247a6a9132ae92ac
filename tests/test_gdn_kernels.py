"""The Gated DeltaNet Triton kernels (engine/kernels/gdn.py, conv1d.py) against the PyTorch
reference (engine/kernels/gdn_ref.py): small ragged batches under Triton's CPU interpreter
without CUDA, and Qwen3.5's layer shape in bf16 on a GPU.

State slots no sequence of the batch owns hold NaN and must stay NaN; a fresh sequence's slot
holds NaN before the call, so a kernel that reads it shows NaN."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import gdn_ref
from tests.support.gdn_batches import delta_inputs, make_batch
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules
from tests.support.triton_versions import each_triton, run_under_triton

DEVICE = "cuda" if HAS_CUDA else "cpu"

_conv_mod, _gdn_mod = import_kernel_modules(
    [("conv1d", "_conv_kernel"), ("gdn", "_recurrent_kernel")]
)


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


# (length, slot, fresh): decodes first (one a padding sequence, slot -1), then prefill chunks:
# shorter than K - 1 continuing and fresh, across several BLOCK_T blocks continuing.
SEQS = [(1, 2, False), (1, 0, False), (1, -1, False), (2, 5, False), (2, 1, True), (19, 4, False)]
NUM_SLOTS = 7  # slots 3 and 6 belong to no sequence
# Qwen3.5-27B's Gated DeltaNet shape: transformers' Qwen3_5TextConfig defaults
# (linear_num_key_heads 16, linear_num_value_heads 32, key/value head dims 128, conv kernel 4).
QWEN35_27B = dict(num_k_heads=16, num_v_heads=32, key_dim=128, value_dim=128, kernel=4)


def _batch(seqs):
    lengths, slots, fresh = zip(*seqs, strict=True)
    return make_batch(list(lengths), list(slots), list(fresh))


def _pool(shape, seqs, gen, dtype):
    """Random states in slots of continuing sequences, NaN elsewhere."""
    pool = torch.full(shape, float("nan"), dtype=dtype)
    for _, slot, fresh in seqs:
        if slot >= 0 and not fresh:
            pool[slot] = (torch.randn(shape[1:], generator=gen) * 0.3).to(dtype)
    return pool


def _owned(seqs):
    return sorted({slot for _, slot, _ in seqs if slot >= 0})


def _real_rows(batch, seqs):
    """Token rows of sequences with a slot (a padding sequence's output is unspecified)."""
    rows = [
        torch.arange(batch.rows(i).start, batch.rows(i).stop)
        for i, s in enumerate(seqs)
        if s[1] >= 0
    ]
    return torch.cat(rows)


def check_conv(seqs, conv_dim, kernel, dtype, gen, atol, bias=True, rtol=0.0):
    batch = _batch(seqs)
    x = torch.randn(batch.num_tokens, conv_dim, generator=gen).to(dtype)
    weight = torch.randn(conv_dim, kernel, generator=gen).to(dtype)
    b = torch.randn(conv_dim, generator=gen).to(dtype) if bias else None
    states = _pool((NUM_SLOTS, conv_dim, kernel - 1), seqs, gen, dtype)
    ref_states = states.clone()
    expected = gdn_ref.causal_conv1d_varlen(
        x, weight, b, ref_states, batch.query_start_loc, batch.slots, batch.fresh
    )
    dev = batch.to(DEVICE)
    got_states = states.to(DEVICE)
    got = _conv_mod.causal_conv1d_varlen(
        x.to(DEVICE),
        weight.to(DEVICE),
        None if b is None else b.to(DEVICE),
        got_states,
        dev.query_start_loc,
        dev.slots,
        dev.fresh,
    )
    rows = _real_rows(batch, seqs)
    torch.testing.assert_close(
        got.cpu()[rows].float(), expected[rows].float(), atol=atol, rtol=rtol
    )
    # the state holds inputs: copied, never rounded
    torch.testing.assert_close(got_states.cpu(), ref_states, atol=0, rtol=0, equal_nan=True)


def check_delta(seqs, shape, dtype, gen, atol, block_v=_gdn_mod.BLOCK_V, views=False):
    batch = _batch(seqs)
    hk, hv, dk, dv = shape
    x = delta_inputs(batch.num_tokens, hk, hv, dk, dv, gen).to(dtype=dtype)
    states = _pool((NUM_SLOTS, hv, dk, dv), seqs, gen, torch.float32)
    ref_states = states.clone()
    expected = gdn_ref.gated_delta_rule_varlen(
        x.q, x.k, x.v, x.g, x.beta, ref_states, batch.query_start_loc, batch.slots, batch.fresh
    )
    d = x.to(DEVICE)
    q, k, v = d.q, d.k, d.v
    if views:  # q, k, v as the model passes them: views of one conv output row
        t = batch.num_tokens
        packed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=1)
        q = packed[:, : hk * dk].view(t, hk, dk)
        k = packed[:, hk * dk : 2 * hk * dk].view(t, hk, dk)
        v = packed[:, 2 * hk * dk :].view(t, hv, dv)
    dev = batch.to(DEVICE)
    got_states = states.to(DEVICE)
    got = _gdn_mod.gated_delta_rule_varlen(
        q,
        k,
        v,
        d.g,
        d.beta,
        got_states,
        dev.query_start_loc,
        dev.slots,
        dev.fresh,
        block_v=block_v,
    )
    rows = _real_rows(batch, seqs)
    torch.testing.assert_close(got.cpu()[rows].float(), expected[rows].float(), atol=atol, rtol=0)
    owned = _owned(seqs)
    torch.testing.assert_close(got_states.cpu()[owned], ref_states[owned], atol=atol, rtol=0)
    unowned = [s for s in range(NUM_SLOTS) if s not in owned]
    assert got_states[unowned].isnan().all(), "a slot no sequence owns was written"


# ---------------------------------------------------------------- interpreter-sized


@pytest.mark.parametrize("bias", [True, False])
def test_conv1d_matches_reference(bias):
    check_conv(
        SEQS,
        conv_dim=40,
        kernel=4,
        dtype=torch.float32,
        gen=torch.Generator().manual_seed(0),
        atol=1e-5,
        bias=bias,
    )


def test_conv1d_wide_kernel_and_bf16():
    seqs = [(1, 0, False), (3, 1, False), (20, 2, True)]
    # outputs up to ~8: two bf16 ulps relative (the sums' order differs from the reference's)
    check_conv(
        seqs,
        conv_dim=24,
        kernel=6,
        dtype=torch.bfloat16,
        gen=torch.Generator().manual_seed(1),
        atol=1e-2,
        rtol=1.6e-2,
    )


def test_conv1d_long_prefill_over_token_splits():
    # 48 tokens, 2 sequences: 3 programs a channel block split each sequence's token blocks
    assert _conv_mod.BLOCK_T == 8
    seqs = [(3, 0, False), (45, 1, False)]
    check_conv(
        seqs,
        conv_dim=16,
        kernel=4,
        dtype=torch.float32,
        gen=torch.Generator().manual_seed(7),
        atol=1e-5,
    )


@pytest.mark.parametrize("block_v", [8, 16])
def test_delta_rule_matches_reference(block_v):
    # Dk 12 and Dv 12 are not powers of two: the masked tails must not leak into the state
    check_delta(
        SEQS,
        (2, 4, 12, 12),
        torch.float32,
        torch.Generator().manual_seed(2),
        atol=2e-5,
        block_v=block_v,
    )


def test_delta_rule_strided_views_and_bf16():
    check_delta(
        SEQS[:5],
        (1, 2, 16, 8),
        torch.bfloat16,
        torch.Generator().manual_seed(3),
        atol=2e-2,
        views=True,
    )


def test_prefill_split_across_calls_then_decode():
    """A prompt over three calls, then a decode, equals the reference run the same way."""
    gen = torch.Generator().manual_seed(4)
    hk, hv, dk, dv = 1, 2, 8, 8
    x = delta_inputs(24, hk, hv, dk, dv, gen)
    pools = [torch.full((2, hv, dk, dv), float("nan")) for _ in range(2)]
    pools[1] = pools[1].to(DEVICE)
    start = 0
    for n in (5, 2, 16, 1):
        part = x.slice(slice(start, start + n))
        step = make_batch([n], [1], [start == 0])
        expected = gdn_ref.gated_delta_rule_varlen(
            part.q,
            part.k,
            part.v,
            part.g,
            part.beta,
            pools[0],
            step.query_start_loc,
            step.slots,
            step.fresh,
        )
        d, s = part.to(DEVICE), step.to(DEVICE)
        got = _gdn_mod.gated_delta_rule_varlen(
            d.q, d.k, d.v, d.g, d.beta, pools[1], s.query_start_loc, s.slots, s.fresh
        )
        torch.testing.assert_close(got.cpu(), expected, atol=2e-5, rtol=0)
        start += n
    torch.testing.assert_close(pools[1].cpu(), pools[0], atol=2e-5, rtol=0, equal_nan=True)


@each_triton
def test_kernels_compile_for_sm90(triton_dir):
    """The kernels build for the H200 at Qwen3.5's shape (tests/support/gdn_sm90_compile.py in a
    fresh process, with the venv's Triton and with the H200's 3.6)."""
    run = run_under_triton(triton_dir, ["-m", "tests.support.gdn_sm90_compile"], timeout=600)
    variants = int(run.stdout.split("variants: ")[-1])
    assert variants == 5 and run.stdout.count("ok ") == variants, run.stdout


# ---------------------------------------------------------------- GPU, Qwen3.5-27B's shape

# bf16 outputs of O(1) (q, k normalised): one bf16 rounding of the output is ~4e-3; the state
# is fp32 in both, so the difference stays at the output's rounding over long sequences.
GPU_ATOL = 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "seqs",
    [
        [(1, s, False) for s in range(6)],  # a decode batch
        [(1, 0, False), (1, 1, False), (3, 2, False), (300, 3, True), (129, 4, False)],
    ],
)
def test_gpu_qwen35_27b_delta_rule(seqs):
    s = QWEN35_27B
    check_delta(
        seqs,
        (s["num_k_heads"], s["num_v_heads"], s["key_dim"], s["value_dim"]),
        torch.bfloat16,
        torch.Generator().manual_seed(5),
        atol=GPU_ATOL,
        views=True,
    )


@pytest.mark.gpu
def test_gpu_qwen35_27b_conv1d():
    s = QWEN35_27B
    conv_dim = 2 * s["num_k_heads"] * s["key_dim"] + s["num_v_heads"] * s["value_dim"]
    seqs = [(1, 0, False), (1, 1, False), (2, 2, False), (513, 3, True), (40, 4, False)]
    check_conv(
        seqs,
        conv_dim,
        s["kernel"],
        torch.bfloat16,
        torch.Generator().manual_seed(6),
        atol=1e-2,
        rtol=1.6e-2,
        bias=False,
    )
