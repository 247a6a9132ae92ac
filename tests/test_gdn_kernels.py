"""The Gated DeltaNet Triton kernels (engine/kernels/gdn.py, gdn_chunked.py, conv1d.py) against
the PyTorch reference (engine/kernels/gdn_ref.py): small ragged batches under Triton's CPU
interpreter without CUDA, and Qwen3.5's layer shape in bf16 on a GPU.

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

_conv_mod, _gdn_mod, _chunked_mod = import_kernel_modules(
    [("conv1d", "_conv_kernel"), ("gdn", "_recurrent_kernel"), ("gdn_chunked", "_scan_kernel")]
)


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


# (length, slot, fresh): decodes first (one a padding sequence, slot -1), then prefill chunks:
# shorter than K - 1 continuing and fresh, across several BLOCK_T blocks continuing.
SEQS = [(1, 2, False), (1, 0, False), (1, -1, False), (2, 5, False), (2, 1, True), (19, 4, False)]
NUM_SLOTS = 7  # slots 3 and 6 belong to no sequence
# Qwen3.5-27B's Gated DeltaNet shape, from its public config.json (linear_num_key_heads 16,
# linear_num_value_heads 48, key/value head dims 128, conv kernel 4; mamba_ssm_dtype float32).
QWEN35_27B = dict(num_k_heads=16, num_v_heads=48, key_dim=128, value_dim=128, kernel=4)


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


def recurrent(block_v=_gdn_mod.BLOCK_V):
    return lambda *args: _gdn_mod.gated_delta_rule_varlen(*args, block_v=block_v)


def chunked(chunk_size=_chunked_mod.CHUNK):
    return lambda *args: _chunked_mod.gated_delta_rule_chunked(*args, chunk_size=chunk_size)


def mixed(num_decodes):
    return lambda *args: _chunked_mod.gated_delta_rule_mixed(*args, num_decodes)


def check_delta(seqs, shape, dtype, gen, atol, rule=None, views=False, state_atol=None):
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
    rule = rule or recurrent()
    got = rule(q, k, v, d.g, d.beta, got_states, dev.query_start_loc, dev.slots, dev.fresh)
    rows = _real_rows(batch, seqs)
    torch.testing.assert_close(got.cpu()[rows].float(), expected[rows].float(), atol=atol, rtol=0)
    owned = _owned(seqs)
    state_atol = atol if state_atol is None else state_atol
    torch.testing.assert_close(got_states.cpu()[owned], ref_states[owned], atol=state_atol, rtol=0)
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
        rule=recurrent(block_v),
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


# Prefill chunks longer than the chunk (16 here), a fresh one over two chunks, one shorter.
LONG_SEQS = [(1, 2, False), (1, -1, False), (2, 5, False), (33, 1, True), (20, 4, False)]


def test_chunked_matches_reference():
    check_delta(
        LONG_SEQS,
        (2, 4, 16, 16),
        torch.float32,
        torch.Generator().manual_seed(8),
        atol=2e-5,
        rule=chunked(16),
    )


def test_chunked_default_chunk_bf16_views():
    # bf16 inputs (on a GPU bf16 operands in the chunk matmuls, fp32 under the interpreter:
    # gdn_chunked._DOT_DTYPES): the reference's fp32 products differ by bf16 roundings
    check_delta(
        [(70, 1, False), (3, 0, True)],
        (1, 2, 16, 16),
        torch.bfloat16,
        torch.Generator().manual_seed(9),
        atol=3e-2,
        rule=chunked(),
        views=True,
    )


def test_mixed_step_decodes_then_prefills():
    check_delta(
        LONG_SEQS,
        (2, 4, 16, 16),
        torch.float32,
        torch.Generator().manual_seed(10),
        atol=2e-5,
        rule=mixed(num_decodes=3),
    )


def test_mixed_step_with_head_dims_under_16_runs_prefills_recurrently():
    check_delta(
        LONG_SEQS[:4],
        (1, 2, 8, 12),
        torch.float32,
        torch.Generator().manual_seed(12),
        atol=2e-5,
        rule=mixed(num_decodes=3),
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
    assert variants == 9 and run.stdout.count("ok ") == variants, run.stdout


# ---------------------------------------------------------------- GPU, Qwen3.5-27B's shape

# At Qwen3.5-27B's shape the outputs are ~0.1 (q normalised and scaled by Dk ** -0.5) and the
# states ~1. The recurrent kernel computes in fp32 as the reference does, and rounds the output
# to bf16 once (~2e-4 here); the chunked kernels' bf16 matmul operands cost more: emulated on the
# CPU in PyTorch (operands rounded to bf16, fp32 sums) over 300 and 1000 tokens, 5e-4 on the
# outputs and 4e-3 on the states.
GPU_ATOL = 4e-3
GPU_STATE_ATOL = {"recurrent": 1e-3, "mixed": 2e-2}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "seqs",
    [
        [(1, s, False) for s in range(6)],  # a decode batch
        [(1, 0, False), (1, 1, False), (3, 2, False), (300, 3, True), (129, 4, False)],
    ],
)
@pytest.mark.parametrize("path", ["recurrent", "mixed"])
def test_gpu_qwen35_27b_delta_rule(seqs, path):
    s = QWEN35_27B
    num_decodes = sum(1 for n, _, _ in seqs if n == 1)
    check_delta(
        seqs,
        (s["num_k_heads"], s["num_v_heads"], s["key_dim"], s["value_dim"]),
        torch.bfloat16,
        torch.Generator().manual_seed(5),
        atol=GPU_ATOL,
        rule=recurrent() if path == "recurrent" else mixed(num_decodes),
        views=True,
        state_atol=GPU_STATE_ATOL[path],
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


@pytest.mark.gpu
def test_gpu_decode_step_replays_in_a_cuda_graph():
    """conv1d and the recurrent rule captured once for 4 decodes (one padding, slot -1), then
    replayed with other inputs, slots and states written into the captured tensors: each
    replay equals the reference on those, as a served decode step replays it."""
    s = QWEN35_27B
    hk, hv, dk, dv = s["num_k_heads"], s["num_v_heads"], s["key_dim"], s["value_dim"]
    conv_dim, kernel = 2 * hk * dk + hv * dv, s["kernel"]
    gen = torch.Generator().manual_seed(11)
    num_slots = 8

    def inputs():
        x = torch.randn(4, conv_dim, generator=gen).bfloat16()
        a = torch.randn(4, hv, generator=gen)
        g = -torch.nn.functional.softplus(a)
        beta = torch.sigmoid(torch.randn(4, hv, generator=gen))
        slots = torch.cat([torch.randperm(num_slots, generator=gen)[:3], torch.tensor([-1])])
        return x, g, beta, slots.int()

    weight = torch.randn(conv_dim, kernel, generator=gen).bfloat16().cuda()
    conv_states = torch.randn(num_slots, conv_dim, kernel - 1, generator=gen).bfloat16().cuda()
    states = (torch.randn(num_slots, hv, dk, dv, generator=gen) * 0.3).cuda()
    static = [t.cuda() for t in inputs()]
    qsl = torch.arange(5, dtype=torch.int32, device="cuda")
    fresh = torch.zeros(4, dtype=torch.bool, device="cuda")

    def step():
        x, g, beta, slots = static
        mixed = _conv_mod.causal_conv1d_varlen(x, weight, None, conv_states, qsl, slots, fresh)
        q = mixed[:, : hk * dk].view(4, hk, dk)
        k = mixed[:, hk * dk : 2 * hk * dk].view(4, hk, dk)
        v = mixed[:, 2 * hk * dk :].view(4, hv, dv)
        return _gdn_mod.gated_delta_rule_varlen(q, k, v, g, beta, states, qsl, slots, fresh)

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(2):
        new = inputs()
        for dst, src in zip(static, new, strict=True):
            dst.copy_(src)
        ref_conv, ref_states = conv_states.cpu(), states.cpu()
        x, g, beta, slots = new
        pack = (qsl.cpu(), slots, fresh.cpu())
        mixed = gdn_ref.causal_conv1d_varlen(x, weight.cpu(), None, ref_conv, *pack)
        q = mixed[:, : hk * dk].view(4, hk, dk)
        k = mixed[:, hk * dk : 2 * hk * dk].view(4, hk, dk)
        v = mixed[:, 2 * hk * dk :].view(4, hv, dv)
        expected = gdn_ref.gated_delta_rule_varlen(q, k, v, g, beta, ref_states, *pack)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(
            out[:3].cpu().float(), expected[:3].float(), atol=GPU_ATOL, rtol=0
        )
        # the conv outputs (q, k, v) may differ from the reference's by a bf16 rounding
        torch.testing.assert_close(states.cpu(), ref_states, atol=5e-3, rtol=0)
        torch.testing.assert_close(conv_states.cpu(), ref_conv, atol=0, rtol=0)
