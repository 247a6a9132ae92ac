"""Our Gemma 3 model: Gemma3ForCausalLM, and Gemma3ForConditionalGeneration (the same text
model with its vision encoder, engine/models/vision/gemma3_vision.py, as `vision`: an image's
encoder rows replace its placeholders' scaled embeddings, and the tokens of one image attend
to each other both ways on every layer, engine/models/layers.py's PagedAttention).

What differs from the Llama family (engine/models/llama.py): embeddings scaled by
sqrt(hidden_size), rounded to the activation dtype; four RMSNorms per layer (before and after
attention, before and after the MLP) plus q/k norms, each computing x * (1 + w); a GeGLU MLP
(gelu-tanh(gate) * up); attention scores scaled by query_pre_attn_scalar**-0.5; sliding-window
layers interleaved with full ones, each type with its own RoPE base (the full layers' with
linear scaling in the 4B and larger models); optional soft-capping of attention scores and of
the final logits. Packed-token forward as in llama.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import cache

import torch
from torch import nn

from engine.kernels.moe_ref import act_and_mul
from engine.models.layers import Linear, PagedAttention, RMSNorm
from engine.models.llama import Attention
from engine.models.model_config import FULL, SLIDING, ModelConfig
from engine.models.rope_tables import RotaryEmbedding
from engine.models.vision import MultimodalEmbeds, build_vision, load_with_vision, merge_images
from engine.models.weights import QKV_GATE_UP, fused_name, load_fused

logger = logging.getLogger(__name__)

TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
"""Checkpoint prefixes of the text model's weights, tried in order: a multimodal checkpoint
saved by transformers 5, one saved by transformers 4, its LM head there, a text-only one."""
VISION_PREFIXES = (
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "vision_tower.",
    "multi_modal_projector.",
)
"""A multimodal checkpoint's image encoder and projector, where its config has none (a
text-only config saved with them): skipped."""


@cache
def _rounded(value: float, dtype: torch.dtype) -> float:
    """`value` rounded to `dtype`, as transformers applies the embedding scale: sqrt(3840)
    = 61.97 becomes 62.0 in bfloat16."""
    return torch.tensor(value, dtype=dtype).item()


class Gemma3MLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate(x)) * up(x)), gate and up in one projection."""

    def __init__(self, cfg: ModelConfig, intermediate_size: int | None = None) -> None:
        """intermediate_size: the width where it is not cfg's (Gemma 4's double-wide MLPs)."""
        super().__init__()
        inter = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * inter, bias=False)
        self.down_proj = Linear(inter, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [num_tokens, 2 * intermediate] -> [num_tokens, intermediate] -> [num_tokens, hidden]
        return self.down_proj(act_and_mul(self.gate_up_proj(x), "gelu_tanh"))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps  # every norm's weight holds 1 + w (load_weights)
        self.input_layernorm = RMSNorm(h, eps)
        # q/k norms, query_pre_attn_scalar, the layer's window and soft-cap: Llama's attention
        # builds them from the config
        self.self_attn = Attention(cfg, rope, layer)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.mlp = Gemma3MLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(h, eps)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's normed MLP output, not yet added to `residual` (None at the
        first layer, where x is the embeddings). Returns this layer's pair."""
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.post_attention_layernorm(self.self_attn(positions, x))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Gemma3ForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        if cfg.query_pre_attn_scalar is None:
            raise ValueError("a Gemma 3 config needs query_pre_attn_scalar")
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        atts = [cfg.layer_attention(i) for i in range(cfg.num_layers)]
        kinds = [cfg.layer_type(i) for i in range(cfg.num_layers)]
        self.ropes = nn.ModuleDict(  # one per layer type (its base and scaling), shared
            {
                kind: RotaryEmbedding.for_layer(atts[kinds.index(kind)], max_positions)
                for kind in (SLIDING, FULL)
                if kind in kinds
            }
        )
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(cfg, i, self.ropes[kind]) for i, kind in enumerate(kinds)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.vision = build_vision(cfg.vision)
        for layer in self.layers if self.vision is not None else ():
            layer.self_attn.attn.images_both_ways = True

    def init_buffers(self, device: torch.device) -> None:
        """Build the buffers that were made on meta (the RoPE tables) on `device`, in fp32."""
        for rope in self.ropes.values():
            rope.init_buffers(device)
        if self.vision is not None:
            self.vision.init_buffers(device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        images: MultimodalEmbeds | None = None,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        x = merge_images(x * _rounded(self.config.hidden_size**0.5, x.dtype), images)
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_seqs, vocab] logits in the LM head's dtype; soft-capped to
        (-cap, cap) by cap * tanh(logits / cap) when the config sets final_logit_softcapping."""
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def attention_layers(self) -> list[PagedAttention]:
        return [layer.self_attn.attn for layer in self.layers]

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    ) -> None:
        """Copy Hugging Face-named tensors into our (fused) parameters; check none is missing
        and none is left over. `copy(dst, src)` does each copy (as in llama.py).

        Gemma's RMSNorm weights w scale by (1 + w): the 1 is added here, once, so that our
        RMSNorm (x * weight) and its fused kernel serve Gemma as they are. (1 + w) is computed
        in fp32 and rounded once to the model's dtype; transformers keeps w and adds 1 in fp32
        at every call, so in bfloat16 the two differ by that one rounding (equal in fp32)."""
        cfg = self.config
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        load_with_vision(
            self.vision,
            weights,
            copy,
            lambda text, elsewhere: load_fused(
                self,
                text,
                copy,
                {"qkv_proj": [q, kv, kv], "gate_up_proj": [cfg.intermediate_size] * 2},
                lambda name: fused_name(name, QKV_GATE_UP),
                family="Gemma 3",
                prefixes=TEXT_PREFIXES,
                skipped=VISION_PREFIXES,
                skipped_what="vision tower weights",
                logger=logger,
                transform=_one_plus_norm,
                loaded_elsewhere=elsewhere,
            ),
        )


def _one_plus_norm(target: str, tensor: torch.Tensor) -> torch.Tensor:
    """A norm weight w as the 1 + w our RMSNorm multiplies by (in fp32); others as stored."""
    return tensor.float() + 1.0 if target.endswith("norm.weight") else tensor
