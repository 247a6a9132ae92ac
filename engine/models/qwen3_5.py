"""Our Qwen3.5 text model: a hybrid of Gated DeltaNet layers (LINEAR: a state per sequence,
engine/models/gated_deltanet.py) and gated full-attention layers (llama.py's Attention with q/k
RMSNorm, partial RoPE and the sigmoid output gate), each followed by a SwiGLU MLP.

Qwen3.5's RMSNorms (the layer norms, q/k norms, the final norm) compute x * (1 + w): the 1 is
added at load, once, so our RMSNorm (x * weight) serves them as it is; the Gated DeltaNet's
gated norm uses w as it is. Checkpoints: Qwen3_5ForCausalLM's (`model.`) or the text part of
Qwen3_5ForConditionalGeneration's (`model.language_model.`) with its vision tower
(`model.visual.`, engine/models/vision/qwen3_5_vision.py): an image's rows replace its
placeholders' embeddings and its tokens take 3-D multimodal RoPE positions
(engine/models/vision/mrope.py). The multi-token-prediction head (`mtp.`) is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable

import torch
from torch import nn

from engine.models.gated_deltanet import GatedDeltaNet
from engine.models.layers import PagedAttention, RMSNorm
from engine.models.linear_attention import LINEAR
from engine.models.llama import MLP, Attention, LlamaForCausalLM
from engine.models.model_config import ModelConfig
from engine.models.rope_tables import RotaryEmbedding
from engine.models.vision import build_vision, load_with_vision
from engine.models.vision.mrope import mrope_positions
from engine.models.weights import load_fused
from engine.multimodal import ImageInput

logger = logging.getLogger(__name__)

TEXT_PREFIXES = ("model.language_model.", "model.")
"""Checkpoint prefixes of the text model's weights, tried in order: a multimodal checkpoint, a
text-only one."""
SKIPPED_PREFIXES = ("model.visual.", "visual.", "mtp.")
"""The multi-token-prediction head, and the vision tower where the config has none: unused."""
MROPE_SECTION = (11, 11, 10)
"""transformers' default mrope_section: frequencies per axis (temporal, height, width)."""

FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", 0),  # Qwen3.5-MoE's
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", 1),
    "linear_attn.in_proj_qkv": ("linear_attn.in_proj_qkvz", 0),
    "linear_attn.in_proj_z": ("linear_attn.in_proj_qkvz", 1),
    "linear_attn.in_proj_b": ("linear_attn.in_proj_ba", 0),
    "linear_attn.in_proj_a": ("linear_attn.in_proj_ba", 1),
    "linear_attn.conv1d": ("linear_attn.conv_weight", None),
}
"""Checkpoint module (within a layer) -> (our parameter's module, shard index; None: the whole
parameter)."""


class Qwen3_5DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        rope: RotaryEmbedding | None,
        layer: int,
        mlp: nn.Module | None = None,
    ) -> None:
        """`mlp`: the feed-forward block ([num_tokens, hidden] -> same); None: a dense MLP."""
        super().__init__()
        self.is_linear = cfg.layer_type(layer) == LINEAR
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
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
        x = self.linear_attn(x) if self.is_linear else self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Qwen3_5ForCausalLM(LlamaForCausalLM):
    """Llama's model with Qwen3.5's layers: embeddings, the final norm, the LM head and the
    packed-token forward are the same."""

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        if cfg.linear_attention is None or not cfg.attn_output_gate:
            raise ValueError("a Qwen3.5 config needs linear_attention and attn_output_gate")
        super().__init__(cfg, max_positions)
        self.vision = build_vision(cfg.vision)
        if self.vision is not None:
            rope = (cfg.vision.get("text_config") or {}).get("rope_parameters") or {}
            section = rope.get("mrope_section") or list(MROPE_SECTION)
            self.rope.mrope = (list(section), bool(rope.get("mrope_interleaved", True)))

    def init_buffers(self, device: torch.device) -> None:
        super().init_buffers(device)
        if self.vision is not None:
            self.vision.init_buffers(device)

    def rope_positions(
        self, token_ids: list[int], images: list[ImageInput]
    ) -> tuple[torch.Tensor, int]:
        """The prompt's [3, len] multimodal positions and the delta of later tokens' positions
        (engine/models/vision/mrope.py)."""
        return mrope_positions(token_ids, images, self.vision.cfg.spatial_merge_size)

    def make_layer(self, layer: int, mlp: nn.Module) -> nn.Module:
        return Qwen3_5DecoderLayer(self.config, self.rope, layer, mlp)

    def attention_layers(self) -> list[PagedAttention]:
        """The full-attention layers' paged attention, in layer order (the KV pool binds)."""
        return [layer.self_attn.attn for layer in self.layers if not layer.is_linear]

    def linear_layers(self) -> list[GatedDeltaNet]:
        """The Gated DeltaNet layers, in layer order (the state pool binds)."""
        return [layer.linear_attn for layer in self.layers if layer.is_linear]

    def _shard_sizes(self) -> dict[str, list[int]]:
        cfg, s = self.config, self.config.linear_attention
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        return {
            "qkv_proj": [2 * q, kv, kv],  # q_proj holds each head's query and gate
            "gate_up_proj": [cfg.intermediate_size] * 2,
            "in_proj_qkvz": [s.conv_dim, s.value_dim],
            "in_proj_ba": [s.num_value_heads] * 2,
        }

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
        loaded_elsewhere: Collection[str] = (),
    ) -> None:
        """Copy Hugging Face-named tensors into our (fused) parameters; check none is missing
        and none is unknown. `copy(dst, src)` does each copy (as in llama.py). The RMSNorm
        weights w become 1 + w (computed in fp32, rounded once to the model's dtype).
        `loaded_elsewhere`: our parameter names the caller fills (a subclass's experts)."""
        load_with_vision(
            self.vision,
            weights,
            copy,
            lambda text, vision: load_fused(
                self,
                text,
                copy,
                self._shard_sizes(),
                _our_name,
                family="Qwen3.5",
                prefixes=TEXT_PREFIXES,
                skipped=SKIPPED_PREFIXES,
                skipped_what="vision tower and multi-token-prediction weights",
                logger=logger,
                transform=_as_stored_here,
                loaded_elsewhere={*loaded_elsewhere, *vision},
            ),
        )


def _as_stored_here(target: str, tensor: torch.Tensor) -> torch.Tensor:
    """A checkpoint tensor as our parameter `target` holds it: Conv1d's [conv_dim, 1, kernel]
    as [conv_dim, kernel]; a norm weight w (the gated delta net's excepted) as 1 + w in fp32."""
    if target.endswith("conv_weight") and tensor.dim() == 3:
        tensor = tensor.squeeze(1)  # Conv1d's [conv_dim, 1, kernel]
    if target.endswith("norm.weight") and ".linear_attn." not in target:
        return tensor.float() + 1.0
    return tensor


def _our_name(name: str) -> tuple[str, int | None]:
    """A checkpoint weight's name (prefix removed) -> (our parameter, shard index or None)."""
    for part, (ours, shard) in FUSED.items():
        if f".{part}." in name:
            return name.replace(part if shard is not None else f"{part}.weight", ours, 1), shard
    return name, None
