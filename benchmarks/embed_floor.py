"""The prefill floor of embedding N inputs of L tokens: their FLOPs over the device's matmul rate
at the model's own GEMM shape, measured in the same run.

FLOPs of N inputs of L tokens (benchmarks.floor owns the per-prompt arithmetic):

    N x (2 x P x L + 4 x layers x heads x head_dim x pairs)

where P is the non-embedding parameters (every parameter but the token, position and type
embedding tables and BERT's unused pooler: the projections, norms and biases a token goes
through; the embedding is a gather, and an embedding model has no LM head), and pairs is the
(query, key) pairs attention scores: L(L+1)/2 for a causal decoder (floor.prefill_flops),
L^2 for a bidirectional encoder. Attention FLOPs are QK^T and PV: 2 x 2 x head_dim per pair,
head and layer.

The rate is that of one [tokens x hidden] x [hidden x intermediate] GEMM in the run's dtype
(tokens: the engine's prefill batch), best of a few timings (CUDA events on a GPU). It is not
floor.measure_hardware's square 8192^3 GEMM: a hidden size of 1024 keeps the matmuls narrow,
below the square peak, and the floor is what this model's own GEMMs can reach.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModel, PretrainedConfig

from benchmarks.floor import ModelShape, attention_flops, prefill_flops
from engine.timing import seconds_per_call

EMBEDDING_PREFIXES = ("embeddings.", "embed_tokens.", "pooler.")
"""Parameter names of transformers' base models that a token's FLOPs do not count."""


def non_embedding_params(config: PretrainedConfig) -> int:
    """P of the module docstring: transformers' base model of `config`, built on the meta
    device (no memory, no time), counted without its embedding tables and pooler."""
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return sum(
        p.numel() for n, p in model.named_parameters() if not n.startswith(EMBEDDING_PREFIXES)
    )


def model_shape(config: PretrainedConfig) -> ModelShape:
    """The numbers of `config` the FLOPs need (num_params: the non-embedding ones)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return ModelShape(
        non_embedding_params(config), config.num_hidden_layers, heads, kv_heads, head_dim
    )


def embed_flops(shape: ModelShape, num_inputs: int, input_len: int, causal: bool) -> float:
    """FLOPs of embedding `num_inputs` inputs of `input_len` tokens (the module docstring)."""
    if causal:
        return num_inputs * prefill_flops(shape, input_len)
    per_input = 2.0 * shape.num_params * input_len + attention_flops(shape, input_len**2)
    return num_inputs * per_input


@dataclass(frozen=True)
class MatmulRate:
    """A GEMM's measured rate and its shape."""

    flops: float
    """FLOP/s, the best of the timings."""
    m: int
    k: int
    n: int
    dtype: torch.dtype

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"[{self.m} x {self.k}] x [{self.k} x {self.n}] {dtype} GEMM"


def prefill_matmul_rate(
    device: torch.device | str, dtype: torch.dtype, m: int, k: int, n: int, repeats: int = 5
) -> MatmulRate:
    """The rate of [m x k] x [k x n] in `dtype` on `device`: the best of `repeats` timings of
    engine.timing.seconds_per_call (CUDA events on a GPU, 20 back-to-back calls each)."""
    a = torch.randn(m, k, device=device).to(dtype)  # [tokens, hidden]
    b = torch.randn(k, n, device=device).to(dtype)  # [hidden, intermediate]
    iters = 20 if torch.device(device).type == "cuda" else 3
    best = min(seconds_per_call(lambda: torch.mm(a, b), device, iters) for _ in range(repeats))
    return MatmulRate(2.0 * m * k * n / best, m, k, n, dtype)
