"""The planner's byte formulas: weights, KV bytes per token, the activation peak and the CUDA
graph pool of a model shape, by arithmetic (no torch). Constants measured on a GPU say where
and with which command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.models.linear_attention import RECURRENT_STATE_BYTES
from engine.models.model_config import ModelConfig

GIB, MIB = 1024**3, 1024**2
WEIGHT_FORMATS = ("none", "int8", "int4")
"""Weight formats the planner chooses from, best quality first; "none" = the activation dtype."""
CHECKPOINT_FORMATS = ("fp8",)
"""Weight formats only read from a checkpoint that holds them (pinned, never chosen)."""
FORMAT_BITS = {"int8": 8, "int4": 4, "fp8": 8}
"""Bits a quantized weight takes, by format (its scales come on top: WeightLayout)."""
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
"""Bytes per element by dtype name (activations, weights, KV cache)."""
SCALE_BYTES = 4
"""Quantized weights keep fp32 scales (one per row, or per group of a row) and, where the
format has them, an fp32 zero point beside each scale."""
CPU_MAX_MODEL_LEN = 8192
"""Longest max_model_len planned on a CPU (it could not decode longer sequences usefully)."""
SAFETY_FRACTION, MIN_SAFETY_BYTES = 0.03, 256 * MIB
"""Budget kept free for what warm-up cannot show (fragmentation under a new mix of lengths)."""
SAMPLING_BYTES_PER_LOGIT = 28
"""Per sampled row and vocabulary entry: float32 logits plus the sampler's temporaries with
every feature on (penalties, top-k/top-p sort, min-p, logprobs, seeded draws); measured on the
H200 (2026-11-29, 256 rows): 26.8 B on the Llama-3-8B shape, 25.4 B on Qwen2.5-7B."""
GRAPH_OVERHEAD_BYTES = 2 * MIB
"""Per captured CUDA graph (kernel parameters, graph bookkeeping)."""
GRAPH_POOL_BASE_BYTES = 256 * MIB
"""What the graph pool holds whatever max_num_seqs is (library workspaces captured into it):
on the H200 (2026-12-01, Llama-3-8B and Qwen2.5-7B shapes, kernels chosen before the capture)
the pool measured 0.15-0.19 GiB with max_model_len 1,024 and 0.27-0.29 GiB with 8,192, for
24 to 256 sequences."""


def size_text(n: float) -> str:
    """Bytes for a message: GiB with two decimals, or MiB / KiB below them."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= scale or unit == "KiB":
            return f"{n / scale:.2f} {unit}"


@dataclass(frozen=True)
class WeightLayout:
    """How a quantized format stores its weights, as quantized_bytes counts them."""

    bits: int
    """Bits per weight (FORMAT_BITS)."""
    group_size: int = 0
    """Weights per scale along a row; 0: one scale per row."""
    zero_points: bool = False
    """A zero point beside each scale (AWQ, asymmetric GPTQ and compressed-tensors)."""
    name: str = ""
    """How reasons and `appliance profile` name it ("" : by its format)."""


def layout_for(fmt: str, group_size: int) -> WeightLayout:
    """The layout of a format quantized at load: int8 per row, int4 in groups of group_size."""
    return WeightLayout(FORMAT_BITS[fmt], group_size if fmt == "int4" else 0)


def layout_text(layout: WeightLayout) -> str:
    """The bytes a layout stores, for `appliance profile`: "0.5 B a weight + 8 B a group of 128
    (scale, zero point)"."""
    extra = " (scale, zero point)" if layout.zero_points else " (scale)"
    per = f"a group of {layout.group_size}" if layout.group_size else "a row"
    scale = SCALE_BYTES * (2 if layout.zero_points else 1)
    return f"{layout.bits / 8:g} B a weight + {scale} B {per}{extra}"


def quantized_bytes(layout: WeightLayout, num_weights: int, num_rows: int) -> int:
    """Bytes of num_weights weights in num_rows rows: bits / 8 each, plus a scale (and a zero
    point) per row or per group_size weights (a block scale is kept per row and group)."""
    groups = -(-num_weights // layout.group_size) if layout.group_size else num_rows
    per_group = SCALE_BYTES * (2 if layout.zero_points else 1)
    return -(-num_weights * layout.bits // 8) + per_group * groups


def weight_bytes(
    m: ModelConfig,
    fmt: str,
    dtype_bytes: int,
    quantize_embeddings: bool,
    group_size: int = 64,
    layout: WeightLayout | None = None,
) -> int:
    """Weights in a format: the projections and the experts quantized (rows as one weight's),
    as `layout` stores them (a checkpoint's own; default: layout_for(fmt, group_size)). Norms
    and routers stay in the activation dtype, and so do the embeddings and the LM head unless
    quantize_embeddings."""
    if fmt == "none":
        return m.num_params * dtype_bytes
    counts = m.param_counts()
    linear, rows, embed, other = counts.linear, counts.linear_rows, counts.embed, counts.other
    tables = 1 if m.tie_word_embeddings else 2
    v = m.vocab_size
    layout = layout or layout_for(fmt, group_size)
    if quantize_embeddings:
        emb = quantized_bytes(layout_for(fmt, group_size), embed, v * tables)
    else:
        emb = embed * dtype_bytes
    return quantized_bytes(layout, linear, rows) + emb + other * dtype_bytes


def expert_bytes(m: ModelConfig, fmt: str, dtype_bytes: int, group_size: int = 64) -> int:
    """Every expert's weights in a format, all MoE layers (part of weight_bytes); 0 for a dense
    model."""
    counts = m.param_counts()
    if fmt == "none" or not counts.experts:
        return counts.experts * dtype_bytes
    return quantized_bytes(layout_for(fmt, group_size), counts.experts, counts.expert_rows)


def experts_read(num_experts: int, num_experts_per_tok: int, num_seqs: int) -> int:
    """The most experts one decode step of num_seqs sequences reads in an MoE layer: each
    sequence's num_experts_per_tok, min(num_experts, num_seqs x k) together (batch 1: k)."""
    return min(num_experts, num_seqs * num_experts_per_tok)


def decode_weight_bytes(
    weights: int, experts: int, num_experts: int, num_experts_per_tok: int, num_seqs: int
) -> int:
    """The weight bytes one decode step of num_seqs sequences reads (the decode floor's): all
    of `weights` but the experts, and of the experts (`experts` bytes, every MoE layer) the
    share experts_read of them per layer. A dense model (experts 0) reads all of `weights`."""
    if not experts:
        return weights
    read = experts_read(num_experts, num_experts_per_tok, num_seqs)
    return weights - experts + experts * read // num_experts


def kv_bytes_per_token(m: ModelConfig, kv_dtype: str) -> int:
    """2 x layers x KV heads x head_dim x bytes (int8 adds a 16-bit scale per token and head):
    the engine's own formula (ModelConfig.kv_cache_bytes_per_token)."""
    return m.kv_cache_bytes_per_token(kv_dtype)


def token_bytes_in_block(m: ModelConfig, kv_dtype: str, draft: ModelConfig | None = None) -> int:
    """What a token takes in a KV block: the model's K/V, and a draft model's beside them
    (speculative decoding: the draft's K/V share the blocks, engine/spec/draft_model.py)."""
    extra = 0 if draft is None else kv_bytes_per_token(draft, kv_dtype)
    return kv_bytes_per_token(m, kv_dtype) + extra


def state_bytes_per_sequence(m: ModelConfig, dtype_bytes: int) -> int:
    """One sequence's slot in the state pool: every LINEAR layer's float32 recurrent state and
    its conv state in the activation dtype (0 for a model without linear layers)."""
    return m.state_bytes_per_sequence(RECURRENT_STATE_BYTES, dtype_bytes)


def mlp_peak_per_token(m: ModelConfig) -> int:
    """Elements the feed-forward sub-layer holds per token at its peak, the larger over the
    model's layers. A dense MLP: its gate_up output and SiLU-and-mul output (3 x
    intermediate_size). An MoE layer holds what a step really routes, not intermediate_size
    (Qwen3-30B-A3B's config names one no layer uses): num_experts_per_tok rows per token, each
    with its gate_up output, activation and down output (3 x moe_intermediate_size + hidden),
    plus the router's logits and their fp32 softmax (3 x num_experts 16-bit elements), plus a
    shared expert's gate_up and activation outputs where there is one (3 x its size)."""
    dense = 3 * _dense_intermediate(m)
    if not m.num_experts:
        return dense
    routed = m.num_experts_per_tok * (3 * m.moe_intermediate_size + m.hidden_size)
    return max(dense, routed + 3 * m.num_experts + 3 * m.shared_expert_intermediate_size)


def gate_up_per_token(m: ModelConfig) -> int:
    """Elements of the largest gate_up output per token: 2 x intermediate_size in a dense
    MLP, num_experts_per_tok x 2 x moe_intermediate_size (the routed rows) in an MoE layer."""
    dense = 2 * _dense_intermediate(m)
    return max(dense, m.num_experts_per_tok * 2 * m.moe_intermediate_size)


def dequantized_bytes(m: ModelConfig, dtype_bytes: int) -> int:
    """A quantized model's prefill holds its largest quantized projection dequantized to 16
    bits: a dense MLP's gate_up, else (every MLP an MoE layer: the MoE kernel reads quantized
    experts as they are) the attention's qkv projection."""
    q, kv = attention_widths(m)
    rows = 2 * _dense_intermediate(m) or q + 2 * kv
    return rows * m.hidden_size * dtype_bytes


def attention_widths(m: ModelConfig) -> tuple[int, int]:
    """(q width, K or V width) of the widest attention layer: num_heads x head_dim and KV heads
    x head_dim, each the largest over the layers (Gemma 4's full layers are wider)."""
    atts = [m.layer_attention(i) for i in range(m.num_layers)]
    return (
        max(m.num_heads * a.head_dim for a in atts),
        max(a.num_kv_heads * a.head_dim for a in atts),
    )


def _dense_intermediate(m: ModelConfig) -> int:
    """intermediate_size where some layer has a dense MLP; 0 where every layer has experts."""
    return m.intermediate_size if m.dense_layers or not m.num_experts else 0


def activation_bytes(
    m: ModelConfig, num_tokens: int, num_rows: float, dtype_bytes: int, fmt: str = "none"
) -> int:
    """Peak of live tensors in one step over num_tokens tokens sampling num_rows rows: the
    forward's peak plus the sampling's. (Measured on the H200, 2026-12-01, Llama-3-8B and
    Qwen2.5-7B shapes: 256 sampled rows add the sampling's bytes to the forward's peak; a few
    dozen rows add less than this counts.)

    Forward, per token: 4 x hidden (the loop's residual stream and layer input, the layer's
    normed input and new residual) plus the larger sub-layer: the MLP's gate_up output and
    SiLU-and-mul output (mlp_peak_per_token: with experts, the routed rows') or attention's
    q/k/v, rotated q/k and output. A quantized model's prefill also holds a weight dequantized
    to 16 bits (dequantized_bytes) beside the gate_up output. Sampling: the final hidden states
    plus SAMPLING_BYTES_PER_LOGIT per row and vocabulary entry."""
    h = m.hidden_size
    q, kv = attention_widths(m)
    sub_layer = max(mlp_peak_per_token(m), h + 3 * q + 3 * kv)
    forward = num_tokens * dtype_bytes * (4 * h + sub_layer)
    if fmt != "none":
        dequantized = dequantized_bytes(m, dtype_bytes)
        gate_up = gate_up_per_token(m)
        forward = max(forward, num_tokens * dtype_bytes * (4 * h + gate_up) + dequantized)
    return forward + sampling_bytes(m, num_tokens, num_rows, dtype_bytes)


def sampling_bytes(m: ModelConfig, num_tokens: int, num_rows: float, dtype_bytes: int) -> int:
    """The final hidden states plus SAMPLING_BYTES_PER_LOGIT per sampled row and vocab entry
    (num_rows may be fractional: the planner sizes for a count between two multiples of 8)."""
    rows = min(num_rows, num_tokens)
    logits = int(rows * m.vocab_size * SAMPLING_BYTES_PER_LOGIT)
    return num_tokens * m.hidden_size * dtype_bytes + logits


def allocator_bytes(
    m: ModelConfig, num_tokens: int, num_rows: float, dtype_bytes: int, fmt: str = "none"
) -> int:
    """What the caching allocator holds at the peak beyond live tensors: blocks cached after
    steps of other shapes. Fitted to `appliance profile --measure` and the GPU memory tests on
    the H200 (2026-12-01; Llama-3-8B and Qwen2.5-7B shapes, 24 to 256 sequences, 16 and 24 GiB
    caps and none; measured 0.58-1.79 GiB, this within -0.3 / +0.2 GiB of each): twice the
    largest forward temporary (a full-budget step's gate_up output: with experts, its routed
    rows', gate_up_per_token), half the sampling's bytes, and a quantized model's dequantized
    weight."""
    largest = num_tokens * gate_up_per_token(m) * dtype_bytes
    cached = 2 * largest + sampling_bytes(m, num_tokens, num_rows, dtype_bytes) // 2
    if fmt != "none":
        cached += dequantized_bytes(m, dtype_bytes)
    return cached


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The decode batch sizes captured as CUDA graphs: 1, 2, 4, then steps of 8 (16 past 64
    sequences) up to max_num_seqs. engine.runner.cuda_graphs captures exactly these."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    sizes += list(range(8, max_num_seqs, 8 if max_num_seqs <= 64 else 16))
    return sorted(set(sizes + [max_num_seqs]))


def graph_pool_bytes(
    m: ModelConfig, max_num_seqs: float, dtype_bytes: int, num_graphs: int | None = None
) -> int:
    """Decode graphs share one pool sized by the largest graph's forward (no logits: sampling
    runs eagerly; with experts, the routed rows': mlp_peak_per_token), plus
    GRAPH_OVERHEAD_BYTES per captured batch size (num_graphs; default the ladder up to
    max_num_seqs) and GRAPH_POOL_BASE_BYTES."""
    h = m.hidden_size
    q, kv = attention_widths(m)
    sub_layer = max(mlp_peak_per_token(m), h + 3 * q + 3 * kv)
    largest = max_num_seqs * dtype_bytes * (4 * h + sub_layer)
    if num_graphs is None:
        num_graphs = len(graph_batch_sizes(math.ceil(max_num_seqs)))
    return int(GRAPH_POOL_BASE_BYTES + largest + GRAPH_OVERHEAD_BYTES * num_graphs)


def model_length_limit(m: ModelConfig, device_kind: str) -> tuple[int, str]:
    """The longest max_model_len this model may run with here, and what sets it."""
    limit, why = m.max_position_embeddings, "the model's max_position_embeddings"
    if device_kind == "cpu" and CPU_MAX_MODEL_LEN < limit:
        limit, why = CPU_MAX_MODEL_LEN, "the CPU's limit"
    return limit, why
