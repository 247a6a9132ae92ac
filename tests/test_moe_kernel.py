"""The Triton fused MoE (engine/kernels/moe.py, moe_align.py) against fused_moe_ref: small ragged
shapes under Triton's CPU interpreter (experts with many tokens, none, one token, k = 1..8,
every activation, biases, fp32 and bf16, int8 experts), both sorts' layout, the wrapper's
errors, an sm_90 build of every tile config; on a GPU Qwen3-30B-A3B's layer shape (bf16 and
int8 experts) and a decode step replayed from a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.moe_ref import ACTIVATIONS, fused_moe_ref
from engine.quant.reference import dequantize_to
from tests.support.triton_modules import HAS_CUDA, import_kernel_modules
from tests.support.triton_versions import each_triton, run_under_triton

_align, _moe = import_kernel_modules(
    [
        ("moe_align", "_align_kernel"),
        ("moe_tiles", "weight_tile"),
        ("moe_gemv", "_gate_up_pairs_kernel"),
        ("moe", "_gate_up_kernel"),
    ]
)[::3]
DEVICE = "cuda" if HAS_CUDA else "cpu"
SMALL = _moe.MoeConfig(16, 16, 16, 4, 1)  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
WIDE = _moe.MoeConfig(32, 32, 32, 4, 1)


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _routing(num_tokens, k, experts, gen, skew=False):
    """Distinct experts per token (as top-k picks them) and softmax weights. skew: expert 0 in
    every token (more than a tile), the rest drawn from the first half (the others get none)."""
    pool = experts // 2 if skew else experts
    ids = torch.stack([torch.randperm(pool, generator=gen)[:k] for _ in range(num_tokens)])
    if skew:
        ids = torch.where(ids == 0, ids[:, :1], ids)  # keep the row distinct: swap 0 with col 0
        ids[:, 0] = 0
    weights = torch.softmax(torch.randn(num_tokens, k, generator=gen), dim=-1)
    return weights.to(DEVICE), ids.to(DEVICE)


def _layer(tokens, hidden, inter, experts, dtype, gen, bias):
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    b13 = torch.randn(experts, 2 * inter, generator=gen) / 4 if bias else None
    b2 = torch.randn(experts, hidden, generator=gen) / 4 if bias else None
    return [None if t is None else t.to(DEVICE, dtype) for t in (x, w13, w2, b13, b2)]


# Max error against the reference, relative to the output's largest value: fp32 differs only
# in summation order; bf16 rounds the intermediate at other points than the reference (and the
# CPU interpreter truncates fp32 -> bf16 casts instead of rounding them).
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def _assert_close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=TOL[dtype] * scale)


# tokens, hidden, inter, experts, k, skew, config: hidden and inter not multiples of the tiles
CASES = [
    (1, 48, 40, 16, 8, False, SMALL),  # decode: one token, eight experts of 16
    (1, 32, 16, 4, 1, False, SMALL),
    (37, 40, 24, 8, 2, True, SMALL),  # expert 0 in every token (3 tiles), experts 4..7 none
    (24, 64, 48, 12, 4, True, WIDE),
    (6, 32, 32, 16, 8, False, WIDE),  # most experts get one or two tokens
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens,hidden,inter,experts,k,skew,config", CASES)
def test_fused_moe_matches_reference(tokens, hidden, inter, experts, k, skew, config, dtype):
    gen = torch.Generator().manual_seed(tokens * 31 + k)
    x, w13, w2, _, _ = _layer(tokens, hidden, inter, experts, dtype, gen, bias=False)
    weights, ids = _routing(tokens, k, experts, gen, skew)
    got = _moe.fused_moe(x, w13, w2, weights, ids, config=config)
    _assert_close(got, fused_moe_ref(x, w13, w2, weights, ids), dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # sigmoid(-large) = 0
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_activation_with_biases(activation, dtype):
    gen = torch.Generator().manual_seed(len(activation))
    x, w13, w2, b13, b2 = _layer(19, 32, 24, 8, dtype, gen, bias=True)
    x = x * 3  # reach swiglu_oai's clamp (|gate|, |up| > 7) on some entries
    weights, ids = _routing(19, 2, 8, gen, skew=True)
    got = _moe.fused_moe(x, w13, w2, weights, ids, activation, b13, b2, config=SMALL)
    _assert_close(got, fused_moe_ref(x, w13, w2, weights, ids, activation, b13, b2), dtype)


def _int8_experts(experts, rows, cols, gen, dtype):
    """(int8 weights [experts, rows, cols], fp32 row scales [experts, rows], their dequantized
    weights in dtype) in engine/quant/weight_format.py's int8 layout, of about 1 / sqrt(cols)."""
    q = torch.randint(-127, 128, (experts, rows, cols), generator=gen, dtype=torch.int8)
    scales = (0.5 + torch.rand(experts, rows, generator=gen)) * (3 / cols) ** 0.5 / 127
    w = dequantize_to(q.view(-1, cols), scales.view(-1), None, 0, dtype).view(q.shape)
    return q.to(DEVICE), scales.to(DEVICE), w.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_int8_experts_match_the_dequantized_reference(dtype, bias):
    """int8 weights with per-row scales against fused_moe_ref on the same weights dequantized
    by engine/quant's reference."""
    gen = torch.Generator().manual_seed(8 + bias)
    tokens, hidden, inter, experts, k = 21, 48, 40, 8, 4
    x, _, _, b13, b2 = _layer(tokens, hidden, inter, experts, dtype, gen, bias)
    q13, s13, w13 = _int8_experts(experts, 2 * inter, hidden, gen, dtype)
    q2, s2, w2 = _int8_experts(experts, hidden, inter, gen, dtype)
    weights, ids = _routing(tokens, k, experts, gen, skew=True)
    got = _moe.fused_moe(
        x, q13, q2, weights, ids, "silu", b13, b2, gate_up_scales=s13, down_scales=s2, config=SMALL
    )
    _assert_close(got, fused_moe_ref(x, w13, w2, weights, ids, "silu", b13, b2), dtype)


def _int4_experts(experts, rows, cols, group, code, gen, dtype):
    """(uint8 codes [experts, rows, cols / 2], fp32 group scales [experts, rows, cols / group],
    the dequantized weights in dtype) in engine/quant/weight_format.py's int4 layout with the table
    `code`, of about 1 / sqrt(cols)."""
    q = torch.randint(0, 256, (experts, rows, cols // 2), generator=gen, dtype=torch.uint8)
    scales = (0.5 + torch.rand(experts, rows, cols // group, generator=gen)) / cols**0.5
    flat = q.view(-1, cols // 2), scales.view(-1, cols // group)
    w = dequantize_to(*flat, code, group, dtype).view(experts, rows, cols)
    return q.to(DEVICE), scales.to(DEVICE), w.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("group,config", [(16, WIDE), (32, SMALL)], ids=["2-groups", "1-group"])
def test_int4_experts_match_the_dequantized_reference(dtype, group, config):
    """int4 codes with group scales against fused_moe_ref on engine/quant's dequantization:
    K-steps of two groups (WIDE's 32) and of one group wider than the config's step (SMALL's
    16 < 32). Any sorted table (NF4's values are no different to the kernel)."""
    gen = torch.Generator().manual_seed(group)
    tokens, hidden, inter, experts, k = 13, 64, 32, 6, 2
    x, _, _, b13, b2 = _layer(tokens, hidden, inter, experts, dtype, gen, bias=True)
    code = torch.randn(16, generator=gen).sort().values / 2
    q13, s13, w13 = _int4_experts(experts, 2 * inter, hidden, group, code, gen, dtype)
    q2, s2, w2 = _int4_experts(experts, hidden, inter, group, code, gen, dtype)
    weights, ids = _routing(tokens, k, experts, gen, skew=True)
    quant = {"gate_up_scales": s13, "down_scales": s2, "code": code.to(DEVICE)}
    got = _moe.fused_moe(
        x, q13, q2, weights, ids, "swiglu_oai", b13, b2, **quant, group_size=group, config=config
    )
    want = fused_moe_ref(x, w13, w2, weights, ids, "swiglu_oai", b13, b2)
    _assert_close(got, want, dtype)


def test_one_bias_int32_ids_and_the_default_config():
    gen = torch.Generator().manual_seed(5)
    tokens = _moe.moe_gemv.MAX_TOKENS + 5  # past the few-token path: the sorted GEMMs
    x, w13, w2, b13, _ = _layer(tokens, 32, 16, 8, torch.float32, gen, bias=True)
    weights, ids = _routing(tokens, 2, 8, gen)
    got = _moe.fused_moe(x, w13, w2, weights, ids.int(), "gelu_tanh", b_gate_up=b13)
    want = fused_moe_ref(x, w13, w2, weights, ids, "gelu_tanh", b_gate_up=b13)
    _assert_close(got, want, torch.float32)


# tokens, k, experts, weights (bf16 / int8 / int4), activation, biases: fused_moe's few-token
# path (config None, up to moe_gemv.MAX_TOKENS tokens), hidden and inter not multiples of its
# tiles except int4's (whole groups along K)
FEW_TOKEN_CASES = [
    (1, 8, 16, "plain", "silu", False),
    (2, 4, 6, "plain", "gelu_tanh", True),
    (4, 2, 4, "plain", "swiglu_oai", True),  # tokens share experts
    (1, 4, 8, "int8", "silu", True),
    (3, 2, 8, "int4", "swiglu_oai", True),
]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens,k,experts,kind,activation,bias", FEW_TOKEN_CASES)
def test_few_tokens_read_each_pairs_expert_directly(
    tokens, k, experts, kind, activation, bias, dtype
):
    """Up to MAX_TOKENS tokens, fused_moe's default runs moe_gemv's two kernels (no sort, the
    slot sum inside the down kernel): the same result as fused_moe_ref."""
    assert tokens <= _moe.moe_gemv.MAX_TOKENS
    gen = torch.Generator().manual_seed(tokens * 7 + k)
    hidden, inter = (64, 32) if kind == "int4" else (40, 24)
    x, w13, w2, b13, b2 = _layer(tokens, hidden, inter, experts, dtype, gen, bias)
    quant, packed = {}, (w13, w2)
    if kind == "int8":
        q13, s13, w13 = _int8_experts(experts, 2 * inter, hidden, gen, dtype)
        q2, s2, w2 = _int8_experts(experts, hidden, inter, gen, dtype)
        quant, packed = {"gate_up_scales": s13, "down_scales": s2}, (q13, q2)
    elif kind == "int4":
        code = torch.randn(16, generator=gen).sort().values / 2
        q13, s13, w13 = _int4_experts(experts, 2 * inter, hidden, 16, code, gen, dtype)
        q2, s2, w2 = _int4_experts(experts, hidden, inter, 16, code, gen, dtype)
        quant = {"gate_up_scales": s13, "down_scales": s2, "code": code.to(DEVICE)}
        quant, packed = quant | {"group_size": 16}, (q13, q2)
    weights, ids = _routing(tokens, k, experts, gen)
    if tokens == 4:
        ids[1] = ids[0]  # two tokens on the same experts
    got = _moe.fused_moe(x, *packed, weights, ids.int(), activation, b13, b2, **quant)
    want = fused_moe_ref(x, w13, w2, weights, ids, activation, b13, b2)
    _assert_close(got, want, dtype)


@pytest.mark.parametrize("one_program", [True, False], ids=["one-program", "scatter"])
def test_sort_puts_each_experts_pairs_in_whole_tiles(one_program, monkeypatch):
    """One program keeps each expert's pairs in flat order; the scatter path (prefill) in any."""
    if not one_program:
        monkeypatch.setattr(_align, "ONE_PROGRAM_PAIRS", 0)
    gen = torch.Generator().manual_seed(2)
    _, ids = _routing(21, 3, 10, gen, skew=True)  # expert 0: 21 pairs, experts 5..9 none
    block_m = 16
    rows, tile_expert = _align.align_by_expert(ids, 10, block_m)
    rows, tile_expert, flat = rows.cpu(), tile_expert.cpu(), ids.reshape(-1).cpu()
    assert rows.numel() == _align.max_rows(63, 10, block_m) == 63 + 10 * 15
    r = 0
    for expert in range(10):
        pairs = (flat == expert).nonzero().squeeze(1).tolist()  # in flat order
        n_tiles = -(-len(pairs) // block_m)
        assert tile_expert[r // block_m : r // block_m + n_tiles].tolist() == [expert] * n_tiles
        got = rows[r : r + len(pairs)].tolist()
        assert (got if one_program else sorted(got)) == pairs
        assert (rows[r + len(pairs) : r + n_tiles * block_m] == 63).all()  # padding sentinel
        r += n_tiles * block_m
    assert (tile_expert[r // block_m :] == -1).all()  # unused tiles exit at once
    assert set(tile_expert.tolist()) == set(range(5)) | {-1}


def test_the_scatter_sort_path_matches_reference(monkeypatch):
    """More pairs than ONE_PROGRAM_PAIRS (prefill) take the counting and scattering kernels."""
    monkeypatch.setattr(_align, "ONE_PROGRAM_PAIRS", 16)
    gen = torch.Generator().manual_seed(6)
    x, w13, w2, b13, b2 = _layer(37, 32, 24, 8, torch.float32, gen, bias=True)
    weights, ids = _routing(37, 2, 8, gen, skew=True)
    got = _moe.fused_moe(x, w13, w2, weights, ids, "silu", b13, b2, config=SMALL)
    _assert_close(got, fused_moe_ref(x, w13, w2, weights, ids, "silu", b13, b2), torch.float32)


def test_no_tokens_gives_an_empty_output():
    gen = torch.Generator().manual_seed(3)
    x, w13, w2, _, _ = _layer(0, 32, 16, 4, torch.float32, gen, bias=False)
    ids = torch.zeros(0, 2, dtype=torch.long, device=DEVICE)
    out = _moe.fused_moe(x, w13, w2, torch.zeros(0, 2, device=DEVICE), ids)
    assert out.shape == (0, 32)


def test_bad_inputs_get_clear_errors():
    gen = torch.Generator().manual_seed(4)
    x, w13, w2, b13, _ = _layer(2, 32, 16, 4, torch.float32, gen, bias=True)
    weights, ids = _routing(2, 2, 4, gen)
    call = _moe.fused_moe
    with pytest.raises(ValueError, match="known: silu"):
        call(x, w13, w2, weights, ids, "relu")
    with pytest.raises(ValueError, match="want w_gate_up"):
        call(x, w13[:, :20], w2, weights, ids)
    with pytest.raises(TypeError, match="w_down is torch.bfloat16"):
        call(x, w13, w2.bfloat16(), weights, ids)
    with pytest.raises(TypeError, match="float32 topk_weights"):
        call(x, w13, w2, weights.half(), ids)
    with pytest.raises(ValueError, match=r"\[num_tokens=2, k\]"):
        call(x, w13, w2, weights[:1], ids[:1])
    with pytest.raises(ValueError, match="x must be contiguous"):
        call(x.t().contiguous().t(), w13, w2, weights, ids)
    with pytest.raises(ValueError, match="b_gate_up is"):
        call(x, w13, w2, weights, ids, b_gate_up=b13[:, :16])
    q13, q2 = w13.to(torch.int8), w2.to(torch.int8)
    with pytest.raises(ValueError, match="torch.int8 experts need gate_up_scales"):
        call(x, q13, q2, weights, ids)
    with pytest.raises(ValueError, match="torch.int8 experts need down_scales"):
        call(x, q13, q2, weights, ids, gate_up_scales=torch.ones(4, 32, device=DEVICE))
    with pytest.raises(TypeError, match="w_gate_up is torch.float32; want torch.int8"):
        call(x, w13, q2, weights, ids)
    with pytest.raises(TypeError, match="scales given with torch.float32 weights"):
        call(x, w13, w2, weights, ids, gate_up_scales=torch.ones(4, 32, device=DEVICE))
    with pytest.raises(ValueError, match=r"down_scales is \(4, 16\); want \(4, 32\)"):
        ones = torch.ones(4, 32, device=DEVICE)
        call(x, q13, q2, weights, ids, gate_up_scales=ones, down_scales=ones[:, :16])
    q13, q2 = q13.view(torch.uint8)[..., :16].contiguous(), q2.view(torch.uint8)[..., :8]
    with pytest.raises(ValueError, match="int4 group_size 12 must be a power of two"):
        call(x, q13, q2.contiguous(), weights, ids, group_size=12)
    with pytest.raises(ValueError, match="torch.uint8 experts need code"):
        ones = torch.ones(4, 32, 2, device=DEVICE)
        scales = {"gate_up_scales": ones, "down_scales": ones[..., :1].contiguous()}
        call(x, q13, q2.contiguous(), weights, ids, group_size=16, **scales)


# ---------------------------------------------------------------- GPU, real shapes

QWEN3_30B_A3B = (2048, 768, 128, 8)  # hidden, moe_intermediate, experts, top-k


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
@pytest.mark.parametrize("tokens", [1, 8, 256])
def test_qwen3_30b_a3b_layer(tokens, kind):
    """bf16 activations, experts in bf16, or int8 / int4 against their dequantized weights."""
    hidden, inter, experts, k = QWEN3_30B_A3B
    gen = torch.Generator().manual_seed(tokens)
    x, w13, w2, _, _ = _layer(tokens, hidden, inter, experts, torch.bfloat16, gen, bias=False)
    weights, ids = _routing(tokens, k, experts, gen)
    quant, dtype = {}, torch.bfloat16
    if kind == "int8":
        q13, s13, w13 = _int8_experts(experts, 2 * inter, hidden, gen, dtype)
        q2, s2, w2 = _int8_experts(experts, hidden, inter, gen, dtype)
        quant = {"gate_up_scales": s13, "down_scales": s2}
    elif kind == "int4":
        code = torch.randn(16, generator=gen).sort().values / 2
        q13, s13, w13 = _int4_experts(experts, 2 * inter, hidden, 64, code, gen, dtype)
        q2, s2, w2 = _int4_experts(experts, hidden, inter, 64, code, gen, dtype)
        quant = {"gate_up_scales": s13, "down_scales": s2, "code": code.to(DEVICE)}
    packed = (q13, q2) if quant else (w13, w2)
    got = _moe.fused_moe(x, *packed, weights, ids, **quant)
    _assert_close(got, fused_moe_ref(x, w13, w2, weights, ids), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [4, 16])  # the few-token path, the sorted GEMMs
def test_decode_step_replays_from_a_cuda_graph(tokens):
    """Captured once, replayed on new tokens and new routing copied into the same buffers."""
    hidden, inter, experts, k = QWEN3_30B_A3B
    gen = torch.Generator().manual_seed(7)
    x, w13, w2, _, _ = _layer(tokens, hidden, inter, experts, torch.bfloat16, gen, bias=False)
    weights, ids = _routing(tokens, k, experts, gen)
    _moe.fused_moe(x, w13, w2, weights, ids)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _moe.fused_moe(x, w13, w2, weights, ids)
    new_x = torch.randn(x.shape, generator=gen).to(DEVICE, x.dtype)
    new_weights, new_ids = _routing(tokens, k, experts, gen)
    x.copy_(new_x)
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _moe.fused_moe(new_x, w13, w2, new_weights, new_ids))
    _assert_close(out, fused_moe_ref(new_x, w13, w2, new_weights, new_ids), torch.bfloat16)


@each_triton
def test_kernels_compile_for_sm90(triton_dir):
    """Every tile config the wrapper picks builds for the H200 (tests/support/moe_sm90_compile.py
    in a fresh process, with the venv's Triton and with the H200's 3.6)."""
    run = run_under_triton(triton_dir, ["-m", "tests.support.moe_sm90_compile"], timeout=600)
    variants = int(run.stdout.split("variants: ")[-1])
    assert variants == 28 and run.stdout.count("ok ") == variants, run.stdout
