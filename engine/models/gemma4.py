"""Our Gemma 4 text model: Gemma4ForCausalLM, and the text part of a
Gemma4ForConditionalGeneration checkpoint (its vision and audio towers are not loaded).

What differs from Gemma 3 (engine/models/gemma3.py): every RMSNorm computes x * w (not
1 + w); attention scores are not scaled (query_pre_attn_scalar = 1, engine/models/
gemma4_config.py); V gets a weightless RMSNorm; the full layers have their own head dim and KV
heads, "proportional" RoPE, and with attention_k_eq_v take V from the K projection; the last
num_kv_shared_layers layers read the K/V of an earlier layer of their type (cfg.kv_source) and
may have double-wide MLPs; per-layer inputs (PLE, the small "e" models): a per-token [layers,
hidden_size_per_layer_input] input computed once from the token ids and the embeddings, each
layer adding a gated projection of its slice; each layer's output scaled by its loaded
layer_scalar; the MoE block (gemma-4-26B-A4B, engine/models/gemma4_moe.py) runs beside the
dense MLP. Packed-token forward as in llama.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.gemma3 import Gemma3MLP, _rounded
from engine.models.gemma4_moe import Gemma4MoE
from engine.models.gemma4_weights import load_gemma4_weights
from engine.models.layers import Linear, PagedAttention, RMSNorm
from engine.models.llama import Attention
from engine.models.model_config import FULL, SLIDING, ModelConfig
from engine.models.rope_tables import RotaryEmbedding
from engine.models.vision import MultimodalEmbeds, build_vision, load_with_vision, merge_images


class WeightlessRMSNorm(nn.Module):
    """x / rms(x) in fp32, back in x's dtype (Gemma 4's v_norm)."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Gemma4Attention(Attention):
    """Llama's attention as cfg.layer_attention describes the layer (head dim, KV heads,
    k_eq_v, kv_shared_from, window), with the weightless norm on V where the layer has V."""

    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, layer: int) -> None:
        super().__init__(cfg, rope, layer)
        if not self.kv_shared:
            self.v_norm = WeightlessRMSNorm(cfg.rms_norm_eps)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = Gemma4Attention(cfg, rope, layer)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.mlp = Gemma3MLP(cfg, cfg.mlp_size(layer))
        self.post_feedforward_layernorm = RMSNorm(h, eps)
        self.moe = self.post_feedforward_layernorm_1 = None
        if cfg.is_moe_layer(layer):
            self.moe = Gemma4MoE(cfg)
            self.post_feedforward_layernorm_1 = RMSNorm(h, eps)
        self.per_layer_input_gate = self.per_layer_projection = None
        if p := cfg.hidden_size_per_layer_input:
            self.per_layer_input_gate = Linear(h, p, bias=False)
            self.per_layer_projection = Linear(p, h, bias=False)
            self.post_per_layer_input_norm = RMSNorm(h, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, per_layer_input: torch.Tensor | None
    ) -> torch.Tensor:
        """x: the residual stream [num_tokens, hidden]; per_layer_input: this layer's slice of
        the per-layer inputs [num_tokens, hidden_size_per_layer_input] (None without PLE).
        Returns the stream after this layer."""
        attn = self.post_attention_layernorm(self.self_attn(positions, self.input_layernorm(x)))
        normed, x = self.pre_feedforward_layernorm(attn, x)  # x: the stream plus attention
        out = self.mlp(normed)
        if self.moe is not None:  # the experts read the stream itself
            out = self.post_feedforward_layernorm_1(out) + self.moe(x)
        x = x + self.post_feedforward_layernorm(out)
        if self.per_layer_input_gate is not None:
            gate = F.gelu(self.per_layer_input_gate(x), approximate="tanh") * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gate))
        return x * self.layer_scalar


class Gemma4ForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        atts = [cfg.layer_attention(i) for i in range(cfg.num_layers)]
        kinds = [cfg.layer_type(i) for i in range(cfg.num_layers)]
        self.ropes = nn.ModuleDict(  # one per layer type (its head dim, base and scaling)
            {
                kind: RotaryEmbedding.for_layer(atts[kinds.index(kind)], max_positions)
                for kind in (SLIDING, FULL)
                if kind in kinds
            }
        )
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(cfg, i, self.ropes[kind]) for i, kind in enumerate(kinds)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        if p := cfg.hidden_size_per_layer_input:
            width = cfg.num_layers * p  # every layer's slice, side by side
            self.embed_tokens_per_layer = nn.Embedding(cfg.vocab_size_per_layer_input, width)
            self.per_layer_model_projection = Linear(cfg.hidden_size, width, bias=False)
            self.per_layer_projection_norm = RMSNorm(p, cfg.rms_norm_eps)
        self.vision = build_vision(cfg.vision)
        text = (cfg.vision or {}).get("text_config") or {}
        self.pad_token_id = int(text.get("pad_token_id") or 0)
        """The id a media placeholder's embeddings are read at (transformers' choice)."""
        self.media_token_ids = tuple(
            int(cfg.vision[key])
            for key in ("image_token_id", "video_token_id", "audio_token_id")
            if self.vision is not None and cfg.vision.get(key) is not None
        )
        """Placeholder ids of images, videos and audio: embedded as the pad token (an image's
        rows are then written over; a video or audio placeholder stays the pad token's)."""
        if self.vision is not None and text.get("use_bidirectional_attention") == "vision":
            for kind, layer in zip(kinds, self.layers):  # the sliding layers only
                layer.self_attn.attn.images_both_ways = kind == SLIDING

    def init_buffers(self, device: torch.device) -> None:
        """Build the buffers that were made on meta (the RoPE tables) on `device`, in fp32."""
        for rope in self.ropes.values():
            rope.init_buffers(device)
        if self.vision is not None:
            self.vision.init_buffers(device)
        self._media_ids = torch.tensor(self.media_token_ids, dtype=torch.int64, device=device)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[num_tokens, layers, hidden_size_per_layer_input]: the token's row of the per-layer
        table (scaled by sqrt of its width, rounded to the dtype) plus the RMS-normed
        projection of its embeddings (scaled by hidden_size**-0.5), times 2**-0.5."""
        cfg, num_tokens = self.config, input_ids.shape[0]
        shape = (num_tokens, cfg.num_layers, cfg.hidden_size_per_layer_input)
        rows = self.embed_tokens_per_layer(input_ids)  # [num_tokens, layers * width]
        rows = rows * _rounded(cfg.hidden_size_per_layer_input**0.5, rows.dtype)
        projected = self.per_layer_model_projection(embeds) * cfg.hidden_size**-0.5
        projected = self.per_layer_projection_norm(projected.view(shape))
        return (projected + rows.view(shape)) * 2**-0.5

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        images: MultimodalEmbeds | None = None,
    ) -> torch.Tensor:
        if self.media_token_ids:  # placeholders read the pad token's rows
            media = torch.isin(input_ids, self._media_ids)
            input_ids = input_ids.masked_fill(media, self.pad_token_id)
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        x = x * _rounded(self.config.hidden_size**0.5, x.dtype)
        x = merge_images(x, images)
        per_layer = None
        if self.config.hidden_size_per_layer_input:
            per_layer = self.per_layer_inputs(input_ids, x)  # [num_tokens, layers, width]
        for i, layer in enumerate(self.layers):
            x = layer(positions, x, None if per_layer is None else per_layer[:, i])
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_seqs, vocab] logits in the LM head's dtype; soft-capped to
        (-cap, cap) by cap * tanh(logits / cap) when the config sets final_logit_softcapping."""
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def attention_layers(self) -> list[PagedAttention]:
        """Every layer's, in layer order, those reading another's K/V included (the runner
        binds the producing layer's views to them, by cfg.kv_source)."""
        return [layer.self_attn.attn for layer in self.layers]

    def load_weights(self, weights, copy=torch.Tensor.copy_) -> None:
        """Copy Hugging Face-named tensors into our (fused) parameters; check none is missing
        and none is left over (engine/models/gemma4_weights.py)."""
        load_with_vision(
            self.vision,
            weights,
            copy,
            lambda text, vision: load_gemma4_weights(self, text, copy, vision),
        )
