"""MXFP4 dequantization against transformers' own conversion (bit for bit, edge exponents
included), and gpt-oss's gate/up order turned into our MoE layout, checked against
transformers' GptOssExperts."""

from __future__ import annotations

import pytest
import torch
from transformers import GptOssConfig
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

from engine.kernels.moe_ref import fused_moe_ref
from engine.quant.mxfp4 import dequantize_mxfp4, gate_up_rows_first

EDGE_SCALES = (0, 1, 2, 126, 127, 128, 200, 253, 254)
"""The subnormal 2^-127 and the next, around 1, and the top (6 x 2^127 overflows to inf)."""
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _packed(experts, rows, groups, gen, low=100, high=140):
    """Random MXFP4 blocks [E, rows, groups, 16] (every byte value) and scales [E, rows, groups]
    in [low, high), with every edge scale somewhere."""
    blocks = torch.randint(0, 256, (experts, rows, groups, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(low, high, (experts, rows, groups), generator=gen, dtype=torch.uint8)
    flat = scales.view(-1)
    flat[: len(EDGE_SCALES)] = torch.tensor(EDGE_SCALES, dtype=torch.uint8)
    return blocks, scales


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_equals_transformers_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    blocks, scales = _packed(3, 10, 4, g, low=0, high=255)  # every exponent but the NaN one
    blocks[0, 1:5] = torch.arange(256, dtype=torch.uint8).view(4, 4, 16)  # every byte
    ours = dequantize_mxfp4(blocks, scales, dtype)  # [E, rows, 4 * 32]
    ref = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [E, 4 * 32, rows]
    assert ours.shape == (3, 10, 128) and ours.dtype == dtype
    assert torch.equal(ours.view(BITS[dtype]), ref.transpose(1, 2).contiguous().view(BITS[dtype]))
    assert ours.isinf().any() and (ours == 0).any()  # the edges were reached


def test_values_from_the_definition():
    """Byte 0x71 at scale 127: 0.5 (low nibble, code 1) then 6.0 (high nibble, code 7); byte
    0xF8: -0.0 then -6.0; at scale 129 everything is four times larger."""
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, :2] = torch.tensor([0x71, 0xF8], dtype=torch.uint8)
    got = dequantize_mxfp4(blocks, torch.tensor([[127]], dtype=torch.uint8), torch.float32)
    assert got[0, :4].tolist() == [0.5, 6.0, -0.0, -6.0] and got[0, 2].signbit()
    got = dequantize_mxfp4(blocks, torch.tensor([[129]], dtype=torch.uint8), torch.float32)
    assert got[0, :4].tolist() == [2.0, 24.0, -0.0, -24.0]


def test_chunks_give_the_same_result():
    g = torch.Generator().manual_seed(1)
    blocks, scales = _packed(2, 9, 3, g)
    whole = dequantize_mxfp4(blocks, scales, torch.bfloat16)
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.bfloat16, rows_per_chunk=5), whole)


def test_bad_inputs_say_what_to_change():
    blocks = torch.zeros(2, 3, 16, dtype=torch.uint8)
    scales = torch.full((2, 3), 127, dtype=torch.uint8)
    scales[1, 2] = 255
    with pytest.raises(ValueError, match="scale byte 255"):
        dequantize_mxfp4(blocks, scales)
    with pytest.raises(ValueError, match=r"\[\.\.\., G, 16\] with scales \[\.\.\., G\]"):
        dequantize_mxfp4(blocks[..., :8], scales)
    with pytest.raises(ValueError, match="must be uint8"):
        dequantize_mxfp4(blocks.int(), scales)
    with pytest.raises(ValueError, match="dequantize MXFP4 to one of"):
        dequantize_mxfp4(blocks, scales.clamp(max=254), torch.int8)


def test_rows_first_on_packed_tensors_equals_rows_first_after():
    g = torch.Generator().manual_seed(2)
    blocks, scales = _packed(2, 8, 2, g)
    after = gate_up_rows_first(dequantize_mxfp4(blocks, scales, torch.bfloat16))
    before = dequantize_mxfp4(gate_up_rows_first(blocks), gate_up_rows_first(scales))
    assert torch.equal(before, after)
    assert torch.equal(after[:, :4], dequantize_mxfp4(blocks, scales)[:, 0::2])  # gate rows
    with pytest.raises(ValueError, match=r"\[num_experts, 2 \* inter"):
        gate_up_rows_first(torch.zeros(2, 7, 3))


def test_gpt_oss_experts_from_mxfp4_equal_transformers():
    """A gpt-oss MoE block's experts from random MXFP4 weights: transformers' conversion into
    its GptOssExperts, ours into fused_moe_ref's layout, the same routed tokens."""
    experts, hidden, inter, tokens, k = 4, 64, 32, 7, 2
    g = torch.Generator().manual_seed(3)
    gu_blocks, gu_scales = _packed(experts, 2 * inter, hidden // 32, g, low=118, high=124)
    down_blocks, down_scales = _packed(experts, hidden, inter // 32, g, low=118, high=124)
    gu_scales.fill_(121)  # the edge scales would overflow the activations: real magnitudes
    down_scales.fill_(121)
    gu_bias = torch.randn(experts, 2 * inter, generator=g) * 0.1
    down_bias = torch.randn(experts, hidden, generator=g) * 0.1
    config = GptOssConfig(
        hidden_size=hidden, intermediate_size=inter, num_local_experts=experts,
        num_experts_per_tok=k,
    )  # fmt: skip
    hf = GptOssExperts(config)
    with torch.no_grad():
        hf.gate_up_proj.copy_(convert_moe_packed_tensors(gu_blocks, gu_scales, dtype=torch.float32))
        hf.down_proj.copy_(
            convert_moe_packed_tensors(down_blocks, down_scales, dtype=torch.float32)
        )
        hf.gate_up_proj_bias.copy_(gu_bias)
        hf.down_proj_bias.copy_(down_bias)
    x = torch.randn(tokens, hidden, generator=g)
    topk_ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    topk_weights = torch.softmax(torch.randn(tokens, k, generator=g), dim=-1)
    with torch.no_grad():
        expect = hf(x, topk_ids, topk_weights)
    w_gate_up = gate_up_rows_first(dequantize_mxfp4(gu_blocks, gu_scales, torch.float32))
    w_down = dequantize_mxfp4(down_blocks, down_scales, torch.float32)  # [E, hidden, inter]
    got = fused_moe_ref(
        x, w_gate_up, w_down, topk_weights, topk_ids, "swiglu_oai",
        gate_up_rows_first(gu_bias), down_bias,
    )  # fmt: skip
    assert expect.abs().max() > 0.1  # the experts did something
    torch.testing.assert_close(got, expect, atol=1e-4, rtol=1e-4)
