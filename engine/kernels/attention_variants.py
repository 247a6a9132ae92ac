"""A layer's attention variant in the Triton paged-attention kernels: sliding window, logit
soft-cap and sinks (their meaning in engine/kernels/torch_ref.py's docstring). The wrappers'
argument checks and launch arguments, and the @triton.jit helpers both kernels call.

Each variant is a constexpr switch of the kernels (WINDOW, SOFTCAP, SINKS), so a plain layer
compiles to the kernel it had without them. Scores in the kernels are in the log2 domain
(logit * log2(e), for exp2), so:
- soft-cap c: c * tanh(x / c) of a logit x is, in log2 units s = x * log2(e),
  c' * tanh(s / c') with c' = c * log2(e); tanh(y) = 1 - 2 / (exp2(2 y log2(e)) + 1), which is
  exact at both ends (exp2 overflowing to inf gives 1; underflowing to 0 gives -1);
- a sink logit joins as sink * log2(e), once, where the softmax is normalised.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # kernels use exp2; scores are pre-multiplied by log2(e)
_LOG2E = tl.constexpr(LOG2E)


def variant_args(
    name: str,
    q: torch.Tensor,  # [tokens, num_heads, head_dim]
    placeholder: torch.Tensor,
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> tuple[tuple, dict]:
    """((window, softcap * log2(e), sinks), constexprs WINDOW / SOFTCAP / SINKS) for a launch.
    Absent variants pass 0, 0.0 and `placeholder` (a tensor of the launch whose address keeps
    its alignment from step to step), never read. Raises ValueError on a bad variant."""
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        raise ValueError(f"{name}: window must be a positive int of tokens, got {window!r}")
    if softcap is not None and not (
        isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap > 0
    ):
        raise ValueError(f"{name}: softcap must be a positive finite number, got {softcap!r}")
    if sinks is not None:
        num_heads = q.shape[1]
        if (
            not isinstance(sinks, torch.Tensor)
            or tuple(sinks.shape) != (num_heads,)
            or not sinks.dtype.is_floating_point
            or sinks.device != q.device
            or sinks.stride(0) != 1
        ):
            got = (
                f"{sinks.dtype} {tuple(sinks.shape)} on {sinks.device}"
                if isinstance(sinks, torch.Tensor)
                else type(sinks).__name__
            )
            raise ValueError(
                f"{name}: sinks must be a contiguous float tensor [{num_heads}] (one logit per "
                f"query head) on {q.device}, got {got}"
            )
    args = (
        0 if window is None else window,
        0.0 if softcap is None else float(softcap) * LOG2E,
        placeholder if sinks is None else sinks,
    )
    flags = dict(WINDOW=window is not None, SOFTCAP=softcap is not None, SINKS=sinks is not None)
    return args, flags


@triton.jit
def soft_cap(s, cap):
    """cap * tanh(s / cap) of log2-domain scores s; cap = softcap * log2(e)."""
    e = tl.exp2(s * (2.0 * _LOG2E / cap))
    return cap - 2.0 * cap / (e + 1.0)


@triton.jit
def sink_logits(sink_ptr, heads, mask=None):
    """The sink logits of query heads `heads` (a scalar or a block; masked lanes 0), log2
    domain, fp32."""
    if mask is None:
        sink = tl.load(sink_ptr + heads)
    else:
        sink = tl.load(sink_ptr + heads, mask=mask, other=0.0)
    return sink.to(tl.float32) * _LOG2E


@triton.jit
def normalise(acc, m_i, l_i, sink_ptr, heads, mask, SINKS: tl.constexpr):
    """The attention output acc / l_i of an online softmax (acc and l_i relative to the
    running max m_i, log2 domain; [rows, BLOCK_D], [rows], [rows]). With SINKS, each row's
    head's sink logit (sink_ptr[heads]) joins the denominator. A row that saw no key
    (l_i == 0) gives 0."""
    if SINKS:
        sink = sink_logits(sink_ptr, heads, mask)
        m_fin = tl.maximum(m_i, sink)  # finite: the sink is
        alpha = tl.exp2(m_i - m_fin)  # 0 for a row that saw no key
        return acc * (alpha / (l_i * alpha + tl.exp2(sink - m_fin)))[:, None]
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    return acc / l_safe[:, None]
