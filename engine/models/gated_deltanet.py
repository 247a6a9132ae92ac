"""The Gated DeltaNet layer of Qwen3.5's linear-attention (LINEAR) layers, over a packed batch
with each sequence's state in a slot of the state pool (engine/memory/state_pool.py).

Per token x: the input projections give q, k, v (one [conv_dim] row: the causal depthwise
convolution runs over it, then SiLU), z (the output gate, [value_dim]), b and a ([Hv] each).
Per value head: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (the log decay),
and the gated delta rule over L2-normalised q and k with scale key_head_dim ** -0.5
(engine/kernels/gdn_ref.py says the recurrence); its output is RMS-normalised per head, scaled
by the norm's weight (plain w, not 1 + w), multiplied by silu(z), and projected by out_proj.

The kernels read the step's metadata (engine/runner/forward_context.py): query_start_loc,
state_slots, and state_fresh (a sequence's first prefill chunk starts from a zero state). On CUDA
the Triton kernels (engine/kernels/conv1d.py, gdn.py) run, elsewhere the PyTorch reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import Linear
from engine.models.model_config import ModelConfig
from engine.runner.forward_context import get_context


def _kernels(device: torch.device):
    """(causal_conv1d_varlen, gated_delta_rule_varlen) for tensors on `device`."""
    from engine.kernels import triton_available

    if device.type == "cuda" and triton_available():
        from engine.kernels.conv1d import causal_conv1d_varlen
        from engine.kernels.gdn import gated_delta_rule_varlen
    else:
        from engine.kernels.gdn_ref import causal_conv1d_varlen, gated_delta_rule_varlen
    return causal_conv1d_varlen, gated_delta_rule_varlen


class GatedRMSNorm(nn.Module):
    """RMSNorm over each value head's output, times silu(gate): weight * norm(x) * silu(z),
    the product in fp32, rounded once to x's dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        # x, gate: [num_tokens, num_heads, head_dim]
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """One LINEAR layer. Our parameters: in_proj_qkvz (the checkpoint's in_proj_qkv and
    in_proj_z, fused), in_proj_ba (in_proj_b and in_proj_a), conv_weight [conv_dim, kernel]
    (conv1d.weight [conv_dim, 1, kernel]), A_log, dt_bias, norm, out_proj. The model runner
    binds conv_state and recurrent_state to this layer's views of the state pool."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        shape = cfg.linear_attention
        if shape is None:
            raise ValueError("a linear-attention layer needs the config's linear_attention shape")
        self.shape = shape
        h, hv = cfg.hidden_size, shape.num_value_heads
        self.in_proj_qkvz = Linear(h, shape.conv_dim + shape.value_dim, bias=False)
        self.in_proj_ba = Linear(h, 2 * hv, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(shape.conv_dim, shape.conv_kernel))
        self.A_log = nn.Parameter(torch.empty(hv))
        self.dt_bias = nn.Parameter(torch.empty(hv))
        self.norm = GatedRMSNorm(shape.value_head_dim, cfg.rms_norm_eps)
        self.out_proj = Linear(shape.value_dim, h, bias=False)
        self.conv_state: torch.Tensor | None = None  # [num_slots, conv_dim, kernel - 1]
        self.recurrent_state: torch.Tensor | None = None  # [num_slots, Hv, Dk, Dv] fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, hidden]
        if self.conv_state is None or self.recurrent_state is None:
            raise RuntimeError("no state pool bound to this layer (ModelRunner binds it)")
        meta = get_context()
        if meta.state_slots is None or meta.state_fresh is None:
            raise RuntimeError("the step's metadata carries no state slots for this layer")
        s, t = self.shape, x.shape[0]
        conv1d, delta_rule = _kernels(x.device)
        mixed, z = self.in_proj_qkvz(x).split([s.conv_dim, s.value_dim], dim=-1)
        b, a = self.in_proj_ba(x).split([s.num_value_heads] * 2, dim=-1)  # [T, Hv] each
        where = (meta.query_start_loc, meta.state_slots, meta.state_fresh)
        # the kernels take these row-strided views as they are (unit-stride channels)
        mixed = conv1d(mixed, self.conv_weight, None, self.conv_state, *where, "silu")
        q, k, v = mixed.split([s.key_dim, s.key_dim, s.value_dim], dim=-1)  # [T, conv_dim]
        q = q.view(t, s.num_key_heads, s.key_head_dim)
        k = k.view(t, s.num_key_heads, s.key_head_dim)
        v = v.view(t, s.num_value_heads, s.value_head_dim)
        beta = b.sigmoid()  # [T, Hv]
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # [T, Hv] fp32
        out = delta_rule(
            q, k, v, g, beta, self.recurrent_state, *where, scale=None, use_qk_l2norm=True
        )  # [T, Hv, Dv]
        out = self.norm(out, z.reshape(t, s.num_value_heads, s.value_head_dim))
        return self.out_proj(out.reshape(t, s.value_dim))
