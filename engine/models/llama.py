"""Our Llama-family model: Llama, Mistral (sliding-window attention), Qwen2 (attention bias) and
Qwen3 (q/k RMSNorm).

Packed-token forward: `forward(input_ids [T], positions [T]) -> hidden [T, hidden]`; attention
metadata comes from the runner's context. Q/K/V and gate/up projections are fused at load time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import torch
from torch import nn

from engine.models.layers import Linear, PagedAttention, RMSNorm, silu_and_mul
from engine.models.model_config import ModelConfig
from engine.models.rope_tables import RotaryEmbedding
from engine.models.vision import MultimodalEmbeds, merge_images
from engine.models.weights import QKV_GATE_UP, fused_name, load_fused


class Attention(nn.Module):
    """Layer `layer`'s attention, built from cfg.layer_attention(layer): its head dim and KV
    heads, window (Mistral, Qwen2's upper layers, Gemma 3/4, gpt-oss), soft-cap and sinks
    (gpt-oss); q/k RMSNorm where cfg.qk_norm; the scale from query_pre_attn_scalar where set
    (Gemma). A k_eq_v layer takes V from the K projection's output (before K's norm and RoPE);
    a layer reading another's K/V (kv_shared_from) has only its q projection and q norm and
    attends over that layer's cache (Gemma 4). `v_norm` (set by a family): applied to V. With
    cfg.attn_output_gate (Qwen3.5) the q projection also gives a gate, each head's q then its
    gate, and the output is multiplied by sigmoid(gate) before o_proj."""

    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, layer: int) -> None:
        super().__init__()
        self.v_norm: nn.Module | None = None
        att = cfg.layer_attention(layer)
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            att.num_kv_heads,
            att.head_dim,
        )
        self.q_size = cfg.num_heads * att.head_dim
        self.kv_size = att.num_kv_heads * att.head_dim
        self.gate_size = self.q_size if cfg.attn_output_gate else 0
        self.kv_shared, self.k_eq_v = att.kv_shared_from is not None, att.k_eq_v
        num_kv = 0 if self.kv_shared else 1 if self.k_eq_v else 2
        self.shard_sizes = [self.q_size + self.gate_size] + [self.kv_size] * num_kv
        """qkv_proj's output rows: q (with its gate, where gated), then k and v (no v where
        k_eq_v, neither where the layer reads another's K/V)."""
        self.qkv_proj = Linear(cfg.hidden_size, sum(self.shard_sizes), bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(att.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        has_k_norm = cfg.qk_norm and not self.kv_shared
        self.k_norm = RMSNorm(att.head_dim, cfg.rms_norm_eps) if has_k_norm else None
        self.rope = rope
        scalar = cfg.query_pre_attn_scalar
        self.attn = PagedAttention(
            cfg.num_heads,
            att.num_kv_heads,
            att.head_dim,
            scale=scalar**-0.5 if scalar else None,
            window=att.sliding_window,
            softcap=att.softcap,
            sinks=att.sinks,
            kv_shared=self.kv_shared,
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        num_tokens = x.shape[0]
        parts = self.qkv_proj(x).split(self.shard_sizes, dim=-1)  # q, k, v as shard_sizes
        q, gate = parts[0], None
        if self.gate_size:  # per head: head_dim of q, then head_dim of gate
            q = q.view(num_tokens, self.num_heads, 2 * self.head_dim)
            q, gate = q[..., : self.head_dim].contiguous(), q[..., self.head_dim :]
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.kv_shared:  # the producing layer stored this step's K/V
            return self._output(self.attn(self.rope.rotate_q(positions, q)), gate)
        k = parts[1].view(num_tokens, self.num_kv_heads, self.head_dim)
        v = k if self.k_eq_v else parts[2].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.v_norm is not None:
            v = self.v_norm(v)
        elif self.k_eq_v:
            v = v.clone()  # K's RoPE may run in place
        if self.k_norm is not None:
            k = self.k_norm(k)
        out = self.attn.rope_and_store(self.rope, positions, q, k, v)  # None: not fused here
        if out is None:
            q, k = self.rope(positions, q, k)
            out = self.attn(q, k, v)  # [num_tokens, num_heads, head_dim]
        return self._output(out, gate)

    def _output(self, out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """o_proj of the attention output [num_tokens, num_heads, head_dim], multiplied by
        sigmoid(gate) first where the layer has a gate (same shape)."""
        out = out.reshape(out.shape[0], self.q_size)
        if gate is not None:
            out = out * torch.sigmoid(gate.reshape(out.shape))
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, intermediate_size: int | None = None) -> None:
        """A SwiGLU MLP of cfg.intermediate_size, or of `intermediate_size` (a shared expert)."""
        super().__init__()
        inter = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * inter, bias=cfg.mlp_bias)
        self.down_proj = Linear(inter, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate_up: a Linear, or a QuantLinear when quantized; None: not fused for this call
        act = self.gate_up_proj.fused_silu_mul(x)
        if act is None:
            act = silu_and_mul(self.gate_up_proj(x))
        return self.down_proj(act)


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, rope: RotaryEmbedding, layer: int, mlp: nn.Module | None = None
    ) -> None:
        """`mlp`: the feed-forward block ([num_tokens, hidden] -> same); None: a dense MLP."""
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, rope, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg) if mlp is None else mlp

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    _FUSED = QKV_GATE_UP  # checkpoint name fragment -> (our fused fragment, shard index)

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        first = cfg.attention_layer_ids()[0]  # the RoPE of every attention layer
        self.rope = RotaryEmbedding.for_layer(cfg.layer_attention(first), max_positions)
        self.layers = nn.ModuleList(
            self.make_layer(i, self.make_mlp(i)) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def make_layer(self, layer: int, mlp: nn.Module) -> nn.Module:
        """Decoder layer `layer` around its feed-forward block (a hybrid family overrides this)."""
        return DecoderLayer(self.config, self.rope, layer, mlp)

    def make_mlp(self, layer: int) -> nn.Module:
        """Layer `layer`'s feed-forward block (a family with experts overrides this)."""
        return MLP(self.config)

    def init_buffers(self, device: torch.device) -> None:
        """Build the buffers that were made on meta (the RoPE tables) on `device`, in fp32."""
        self.rope.init_buffers(device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        images: MultimodalEmbeds | None = None,
    ) -> torch.Tensor:
        x = merge_images(self.embed_tokens(input_ids), images)  # [num_tokens, hidden]
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_seqs, vocab] logits in the LM head's dtype (the sampler widens them to fp32
        only where a step needs more than argmax)."""
        return self.lm_head(hidden)

    def attention_layers(self) -> list[PagedAttention]:
        return [layer.self_attn.attn for layer in self.layers]

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
        loaded_elsewhere: Collection[str] = (),
    ) -> None:
        """Copy Hugging Face-named tensors into our (fused) parameters; check none is missing.
        `copy(dst, src)` does each copy (engine.models.loader's runs them on threads; the
        caller then waits for them). `loaded_elsewhere`: our parameter names the caller fills
        and checks itself (a subclass's experts)."""
        cfg = self.config
        shard_sizes = {
            "qkv_proj": [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2,
            "gate_up_proj": [cfg.intermediate_size] * 2,
        }
        load_fused(
            self,
            weights,
            copy,
            shard_sizes,
            lambda name: fused_name(name, self._FUSED),
            loaded_elsewhere=loaded_elsewhere,
        )
