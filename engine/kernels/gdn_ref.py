"""PyTorch reference of the Gated DeltaNet layer's kernels over a packed batch (the layout and
the state pool in engine/kernels/gdn_args.py): the causal depthwise conv1d with its rolling
state, and the gated delta rule token by token and by chunks. The CPU path of the engine and
what the Triton kernels (conv1d.py, gdn.py) are tested against.

The gated delta rule, per value head, with S the [Dk, Dv] state and q scaled (and, with
use_qk_l2norm, q and k L2-normalised): each token t
    S <- exp(g_t) * S                      (g_t <= 0: the log decay)
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T   (the delta rule: correct what S predicts for k_t)
    o_t = S^T q_t
Key head h // (Hv // Hk) serves value head h. Everything is computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels.gdn_args import check_batch, check_conv, check_delta_rule, default_scale

L2NORM_EPS = 1e-6
"""l2norm(x) = x / sqrt(sum(x^2) + eps), as Qwen3.5's checkpoints were trained with."""
CHUNK_SIZE = 64
"""Tokens a chunk in the chunked form; longer sequences take it in gated_delta_rule_varlen."""


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + L2NORM_EPS) over the last dim."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def causal_conv1d_varlen(
    x: torch.Tensor,  # [num_tokens, conv_dim]
    weight: torch.Tensor,  # [conv_dim, kernel]
    bias: torch.Tensor | None,  # [conv_dim]
    conv_states: torch.Tensor,  # [num_slots, conv_dim, kernel - 1], updated in place
    query_start_loc: torch.Tensor,  # [num_seqs + 1]
    slots: torch.Tensor,  # [num_seqs]
    fresh: torch.Tensor,  # [num_seqs] bool
    activation: str | None = "silu",
) -> torch.Tensor:  # [num_tokens, conv_dim] in x's dtype
    """Each channel's causal convolution out_t = bias + sum_j weight[:, j] * x_{t-K+1+j}, then
    the activation; inputs before a sequence's first token here come from its slot's conv state
    (zeros when fresh). Each slot then holds the sequence's last K - 1 inputs: a sequence of
    fewer than K - 1 tokens keeps the newest of its old entries, shifted towards the front."""
    check_conv(x, weight, bias, conv_states, activation)
    check_batch("causal_conv1d_varlen", x.shape[0], query_start_loc, slots, fresh, x.device)
    conv_dim, kernel = weight.shape
    width = kernel - 1
    starts = query_start_loc.tolist()
    taps = weight.float().unsqueeze(1)  # [conv_dim, 1, kernel]
    bias32 = None if bias is None else bias.float()
    out = torch.zeros_like(x)
    for i, (slot, is_fresh) in enumerate(zip(slots.tolist(), fresh.tolist(), strict=True)):
        lo, hi = starts[i], starts[i + 1]
        if is_fresh or slot < 0:
            previous = x.new_zeros(conv_dim, width, dtype=torch.float32)
        else:
            previous = conv_states[slot].float()
        inputs = torch.cat([previous, x[lo:hi].float().T], dim=1)  # [conv_dim, width + len]
        y = F.conv1d(inputs.unsqueeze(0), taps, bias32, groups=conv_dim)[0]  # [conv_dim, len]
        if activation == "silu":
            y = F.silu(y)
        out[lo:hi] = y.T.to(x.dtype)
        if slot >= 0:
            conv_states[slot] = inputs[:, inputs.shape[1] - width :].to(conv_states.dtype)
    return out


def gated_delta_rule_varlen(
    q: torch.Tensor,  # [num_tokens, Hk, Dk]
    k: torch.Tensor,  # [num_tokens, Hk, Dk]
    v: torch.Tensor,  # [num_tokens, Hv, Dv]
    g: torch.Tensor,  # [num_tokens, Hv] log decay
    beta: torch.Tensor,  # [num_tokens, Hv]
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] float32, updated in place
    query_start_loc: torch.Tensor,  # [num_seqs + 1]
    slots: torch.Tensor,  # [num_seqs]
    fresh: torch.Tensor,  # [num_seqs] bool
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:  # [num_tokens, Hv, Dv] in v's dtype
    """The gated delta rule of every sequence, from its slot's state (zeros when fresh), the
    final state written back to the slot: sequences longer than chunk_size by chunks, the rest
    token by token (all of them in one lock-step loop)."""
    return _delta_rule(
        q, k, v, g, beta, states, query_start_loc, slots, fresh, scale, use_qk_l2norm, chunk_size
    )


def gated_delta_rule_recurrent(
    q, k, v, g, beta, states, query_start_loc, slots, fresh, scale=None, use_qk_l2norm=True
) -> torch.Tensor:
    """gated_delta_rule_varlen token by token for every sequence."""
    return _delta_rule(
        q, k, v, g, beta, states, query_start_loc, slots, fresh, scale, use_qk_l2norm, None
    )


def gated_delta_rule_chunked(
    q,
    k,
    v,
    g,
    beta,
    states,
    query_start_loc,
    slots,
    fresh,
    scale=None,
    use_qk_l2norm=True,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """gated_delta_rule_varlen by chunks of chunk_size tokens for every sequence."""
    if chunk_size < 1:
        raise ValueError(f"gated_delta_rule_chunked: chunk_size {chunk_size}; pass at least 1")
    return _delta_rule(
        q, k, v, g, beta, states, query_start_loc, slots, fresh, scale, use_qk_l2norm, -chunk_size
    )


def _delta_rule(
    q, k, v, g, beta, states, query_start_loc, slots, fresh, scale, use_qk_l2norm, chunking
) -> torch.Tensor:
    """chunking: None all token by token; c > 0 sequences longer than c by chunks of c;
    c < 0 all by chunks of -c."""
    check_delta_rule(q, k, v, g, beta, states)
    check_batch("gated_delta_rule_varlen", q.shape[0], query_start_loc, slots, fresh, q.device)
    num_v_heads = v.shape[1]
    group = num_v_heads // q.shape[1]
    scale = default_scale(q.shape[2], scale)
    q32, k32 = q.float(), k.float()
    if use_qk_l2norm:
        q32, k32 = l2norm(q32), l2norm(k32)
    # [num_tokens, Hv, Dk]: key head h // group serves value head h
    q32 = (q32 * scale).repeat_interleave(group, dim=1)
    k32 = k32.repeat_interleave(group, dim=1)
    v32, g32, beta32 = v.float(), g.float(), beta.float()

    starts = query_start_loc.tolist()
    slot_ids = slots.tolist()
    out = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    initial = _initial_states(states, slots, fresh)  # [num_seqs, Hv, Dk, Dv]
    by_token, final = [], {}
    for i in range(len(slot_ids)):
        lo, hi = starts[i], starts[i + 1]
        if chunking is None or (chunking > 0 and hi - lo <= chunking):
            by_token.append(i)
            continue
        rows = slice(lo, hi)
        o, final[i] = _chunked_one(
            q32[rows], k32[rows], v32[rows], g32[rows], beta32[rows], initial[i], abs(chunking)
        )
        out[rows] = o.to(out.dtype)
    if by_token:
        o, s = _lockstep(q32, k32, v32, g32, beta32, initial[by_token], starts, by_token)
        out.index_copy_(0, o[0], o[1].to(out.dtype))
        final.update(zip(by_token, s, strict=True))
    for i, slot in enumerate(slot_ids):
        if slot >= 0:
            states[slot] = final[i]
    return out


def _initial_states(states, slots, fresh) -> torch.Tensor:  # [num_seqs, Hv, Dk, Dv] fp32
    """Each sequence's starting state: its slot's, or zeros when fresh or padding (slot < 0)."""
    if states.shape[0] == 0:
        return states.new_zeros(slots.shape[0], *states.shape[1:])
    read = (~fresh & (slots >= 0)).view(-1, 1, 1, 1)
    return torch.where(read, states[slots.clamp(min=0).long()], 0.0)


def _lockstep(q, k, v, g, beta, state, starts, seqs):
    """The recurrence of the sequences `seqs` together, one token of each a step.
    Returns ((rows [n], outputs [n, Hv, Dv]), final states [len(seqs), Hv, Dk, Dv])."""
    lengths = [starts[i + 1] - starts[i] for i in seqs]
    state = state.clone()
    rows_all = [torch.zeros(0, dtype=torch.long, device=q.device)]
    outs = [v.new_zeros(0, *v.shape[1:])]
    for t in range(max(lengths)):
        live = [j for j, n in enumerate(lengths) if n > t]
        idx = torch.tensor(live, dtype=torch.long, device=q.device)
        rows = torch.tensor([starts[seqs[j]] + t for j in live], dtype=torch.long, device=q.device)
        s = state[idx] * g[rows].exp()[:, :, None, None]  # [live, Hv, Dk, Dv]
        k_t = k[rows]  # [live, Hv, Dk]
        predicted = torch.einsum("nhkv,nhk->nhv", s, k_t)
        delta = (v[rows] - predicted) * beta[rows][:, :, None]  # [live, Hv, Dv]
        s = s + k_t[:, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("nhkv,nhk->nhv", s, q[rows]))
        rows_all.append(rows)
        state[idx] = s
    return (torch.cat(rows_all), torch.cat(outs)), state


def _chunked_one(q, k, v, g, beta, state, chunk_size):
    """One sequence by chunks. q, k [L, Hv, Dk], v [L, Hv, Dv], g, beta [L, Hv] (fp32, q scaled
    and normalised), state [Hv, Dk, Dv]. Returns (o [L, Hv, Dv], final state).

    Within a chunk, with gamma_t = exp(g_1 + ... + g_t) and S the state before it, the delta
    rule's corrections u_t (so that S_t = gamma_t S + sum_{i<=t} gamma_t/gamma_i k_i u_i^T)
    solve the unit lower-triangular system
        u_t + sum_{i<t} beta_t gamma_t/gamma_i (k_t . k_i) u_i = beta_t (v_t - gamma_t S^T k_t),
    and o_t = gamma_t S^T q_t + sum_{i<=t} gamma_t/gamma_i (q_t . k_i) u_i."""
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [Hv, L, D]
    g, beta = g.T, beta.T  # [Hv, L]
    length, value_dim = q.shape[1], v.shape[2]
    out = torch.empty_like(v)
    for lo in range(0, length, chunk_size):
        rows = slice(lo, min(lo + chunk_size, length))
        qc, kc, vc, bc = q[:, rows], k[:, rows], v[:, rows], beta[:, rows]
        log_gamma = g[:, rows].cumsum(-1)  # [Hv, C]
        n = log_gamma.shape[1]
        log_ratio = log_gamma[:, :, None] - log_gamma[:, None, :]  # [Hv, C, C]: gamma_t/gamma_i
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        ratio = torch.where(causal, log_ratio, float("-inf")).exp()  # 0 above the diagonal
        system = bc[:, :, None] * (kc @ kc.transpose(1, 2)) * ratio  # diagonal ignored below
        gamma = log_gamma.exp()  # [Hv, C]
        rhs = torch.cat([bc[:, :, None] * vc, (bc * gamma)[:, :, None] * kc], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u = solved[..., :value_dim] - solved[..., value_dim:] @ state  # [Hv, C, Dv]
        out[:, rows] = (gamma[:, :, None] * qc) @ state + ((qc @ kc.transpose(1, 2)) * ratio) @ u
        to_end = (log_gamma[:, -1:] - log_gamma).exp()  # [Hv, C]: gamma_C / gamma_i
        state = gamma[:, -1, None, None] * state + (to_end[:, :, None] * kc).transpose(1, 2) @ u
    return out.transpose(0, 1), state
