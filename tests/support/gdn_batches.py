"""Random packed batches for the Gated DeltaNet kernel tests (engine/kernels/gdn_args.py's
layout): ragged sequences, each with a slot in a state pool and a fresh flag."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """One step's packing: query_start_loc [num_seqs + 1] int32, slots [num_seqs] int32, fresh
    [num_seqs] bool, and the lengths they were built from."""

    lengths: list[int]
    query_start_loc: torch.Tensor
    slots: torch.Tensor
    fresh: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def rows(self, i: int) -> slice:
        start = sum(self.lengths[:i])
        return slice(start, start + self.lengths[i])

    def to(self, device) -> Batch:
        return Batch(
            self.lengths,
            self.query_start_loc.to(device),
            self.slots.to(device),
            self.fresh.to(device),
        )


def make_batch(lengths: list[int], slots: list[int], fresh: list[bool]) -> Batch:
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return Batch(
        list(lengths),
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(slots, dtype=torch.int32),
        torch.tensor(fresh, dtype=torch.bool),
    )


@dataclass
class DeltaInputs:
    """q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv] as Qwen3.5 builds them: g = -exp(A) *
    softplus(a + dt_bias) (log decay <= 0), beta = sigmoid(b)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    def slice(self, rows: slice) -> DeltaInputs:
        return DeltaInputs(*(t[rows] for t in (self.q, self.k, self.v, self.g, self.beta)))

    def to(self, device=None, dtype=None) -> DeltaInputs:
        """q, k, v to dtype; g and beta stay float32."""
        qkv = [t.to(device=device, dtype=dtype) for t in (self.q, self.k, self.v)]
        return DeltaInputs(*qkv, self.g.to(device), self.beta.to(device))


def delta_inputs(num_tokens, num_k_heads, num_v_heads, key_dim, value_dim, gen) -> DeltaInputs:
    """Random inputs in the model's ranges (fp32, on the CPU)."""
    q = torch.randn(num_tokens, num_k_heads, key_dim, generator=gen)
    k = torch.randn(num_tokens, num_k_heads, key_dim, generator=gen)
    v = torch.randn(num_tokens, num_v_heads, value_dim, generator=gen)
    a = torch.randn(num_tokens, num_v_heads, generator=gen)
    decay_rate = torch.rand(num_v_heads, generator=gen) * 4 + 0.1  # exp(A_log)
    g = -decay_rate * torch.nn.functional.softplus(a)
    beta = torch.sigmoid(torch.randn(num_tokens, num_v_heads, generator=gen))
    return DeltaInputs(q, k, v, g, beta)
