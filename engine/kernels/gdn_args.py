"""The packed-batch layout the Gated DeltaNet kernels take (engine/kernels/gdn_ref.py, gdn.py,
conv1d.py) and the checks of their arguments, with errors that say what to change.

A step's tokens are packed along the first axis, sequence i owning rows
query_start_loc[i]:query_start_loc[i + 1] (decodes first, one row each, then prefill chunks:
engine/runner/forward_context.py). Sequence i keeps its state in slot slots[i] of a state pool:
- conv state [num_slots, conv_dim, conv_kernel - 1] in the activation dtype: the sequence's
  last conv_kernel - 1 conv inputs, oldest first;
- recurrent state [num_slots, num_v_heads, key_head_dim, value_head_dim] in float32: the
  gated delta rule's matrix S, read as o_t = S_t^T q_t. It is kept in fp32 because it
  integrates every token of the sequence (a decay times the old state plus a rank-one update
  each token), and rounding it to bf16 each step would compound over long contexts.
fresh[i] (bool) says the sequence starts from a zero state (its first prefill chunk) instead of
reading its slot. A slot id below 0 marks a padding sequence (a CUDA-graph batch filled up to
its captured size): nothing of its state is read or written.
"""

from __future__ import annotations

import torch

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CONV_ACTIVATIONS = ("silu", None)
"""Activations the conv kernels apply after the convolution (None: none)."""


def check_batch(name: str, num_tokens: int, query_start_loc, slots, fresh, device) -> None:
    """The packing tensors: int32/int64 query_start_loc of num_seqs + 1 entries, integer slots
    and bool fresh of num_seqs, on the activations' device. Values are not read (no host
    sync): query_start_loc must start at 0, rise, and end at num_tokens."""
    if query_start_loc.dim() != 1 or query_start_loc.shape[0] < 1:
        raise ValueError(
            f"{name}: query_start_loc must be [num_seqs + 1], got {tuple(query_start_loc.shape)}"
        )
    num_seqs = query_start_loc.shape[0] - 1
    if slots.shape != (num_seqs,) or fresh.shape != (num_seqs,):
        raise ValueError(
            f"{name}: slots and fresh must be [num_seqs] = [{num_seqs}] (query_start_loc has "
            f"num_seqs + 1 entries), got {tuple(slots.shape)} and {tuple(fresh.shape)}"
        )
    for label, t in (("query_start_loc", query_start_loc), ("slots", slots)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: {label} is {t.dtype}; pass int32 or int64")
    if fresh.dtype != torch.bool:
        raise TypeError(f"{name}: fresh is {fresh.dtype}; pass a bool tensor")
    for label, t in (("query_start_loc", query_start_loc), ("slots", slots), ("fresh", fresh)):
        if t.device != device:
            raise ValueError(f"{name}: {label} is on {t.device}, the activations on {device}")
    if num_tokens < 0:
        raise ValueError(f"{name}: negative token count {num_tokens}")


def check_conv(x, weight, bias, conv_states, activation) -> None:
    """causal_conv1d_varlen's tensors: x [T, conv_dim], weight [conv_dim, K], bias [conv_dim]
    or None, conv_states [num_slots, conv_dim, K - 1] in x's dtype."""
    if activation not in CONV_ACTIVATIONS:
        raise ValueError(f"causal_conv1d_varlen: activation {activation!r}; pass 'silu' or None")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"causal_conv1d_varlen: x is {x.dtype}; pass float16, bfloat16 or float32")
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(
            f"causal_conv1d_varlen: x must be [num_tokens, conv_dim] and weight "
            f"[conv_dim, kernel], got {tuple(x.shape)} and {tuple(weight.shape)} (a Conv1d "
            f"weight [conv_dim, 1, kernel] is passed as weight.squeeze(1))"
        )
    conv_dim, kernel = weight.shape
    if kernel < 2:
        raise ValueError(f"causal_conv1d_varlen: kernel width {kernel}; it must be at least 2")
    if bias is not None and bias.shape != (conv_dim,):
        raise ValueError(
            f"causal_conv1d_varlen: bias must be [{conv_dim}], got {tuple(bias.shape)}"
        )
    if conv_states.dim() != 3 or conv_states.shape[1:] != (conv_dim, kernel - 1):
        raise ValueError(
            f"causal_conv1d_varlen: conv_states must be [num_slots, {conv_dim}, {kernel - 1}], "
            f"got {tuple(conv_states.shape)}"
        )
    if conv_states.dtype != x.dtype:
        raise TypeError(
            f"causal_conv1d_varlen: conv_states is {conv_states.dtype}, x {x.dtype}; the conv "
            f"state is kept in the activation dtype"
        )


def check_delta_rule(q, k, v, g, beta, states) -> None:
    """gated_delta_rule_varlen's tensors: q, k [T, Hk, Dk], v [T, Hv, Dv] (Hv a multiple of
    Hk), g and beta [T, Hv], states [num_slots, Hv, Dk, Dv] float32."""
    name = "gated_delta_rule_varlen"
    if q.dtype not in ACTIVATION_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            f"{name}: q, k, v are {q.dtype}, {k.dtype}, {v.dtype}; pass one of float16, "
            f"bfloat16, float32 for all three"
        )
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[0] != q.shape[0]:
        raise ValueError(
            f"{name}: q and k must be [num_tokens, Hk, Dk] and v [num_tokens, Hv, Dv], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    num_tokens, num_k_heads, key_dim = q.shape
    num_v_heads, value_dim = v.shape[1:]
    if num_v_heads % num_k_heads:
        raise ValueError(f"{name}: Hv {num_v_heads} must be a multiple of Hk {num_k_heads}")
    for label, t in (("g", g), ("beta", beta)):
        if t.shape != (num_tokens, num_v_heads):
            raise ValueError(
                f"{name}: {label} must be [num_tokens, Hv] = "
                f"[{num_tokens}, {num_v_heads}], got {tuple(t.shape)}"
            )
    if states.dim() != 4 or states.shape[1:] != (num_v_heads, key_dim, value_dim):
        raise ValueError(
            f"{name}: states must be [num_slots, {num_v_heads}, {key_dim}, {value_dim}], got "
            f"{tuple(states.shape)}"
        )
    if states.dtype != torch.float32:
        raise TypeError(f"{name}: states is {states.dtype}; the recurrent state is float32")


def default_scale(key_dim: int, scale: float | None) -> float:
    """The query scale: key_dim ** -0.5 unless given."""
    return key_dim**-0.5 if scale is None else float(scale)
