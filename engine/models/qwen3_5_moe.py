"""Our Qwen3.5-MoE text model (qwen3_5_moe; Qwen3.5-35B-A3B): Qwen3.5's hybrid of Gated DeltaNet
and gated full-attention layers (engine/models/qwen3_5.py) with a mixture-of-experts block in
every layer's MLP place: a softmax router whose top-k weights are renormalized to sum to one
(transformers' Qwen3_5MoeTopKRouter always divides by their sum), the routed experts on
MoEBlock (the fused Triton MoE kernel on CUDA), and a shared expert every token runs, scaled by
sigmoid(shared_expert_gate(x)).

Checkpoints as Qwen3.5's (the text model's or a multimodal checkpoint's text part; the vision
tower and the multi-token-prediction head skipped). The experts load per expert or fused per
layer (engine/models/moe_weights.py); the router is `layers.L.mlp.gate.weight`, the shared
expert `layers.L.mlp.shared_expert.{gate,up,down}_proj.weight` (gate and up fused into our
gate_up_proj) and its gate `layers.L.mlp.shared_expert_gate.weight`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from engine.models.llama import MLP
from engine.models.model_config import ModelConfig
from engine.models.moe_block import MoEBlock, softmax_topk_renormalized
from engine.models.moe_weights import ExpertWeights
from engine.models.qwen3_5 import TEXT_PREFIXES, Qwen3_5ForCausalLM


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        if not cfg.num_experts or not cfg.shared_expert_intermediate_size:
            raise ValueError(
                "a Qwen3.5-MoE config needs num_experts and shared_expert_intermediate_size"
            )
        super().__init__(cfg, max_positions)

    def make_mlp(self, layer: int) -> nn.Module:
        cfg = self.config
        return MoEBlock(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            softmax_topk_renormalized,
            shared_expert=MLP(cfg, cfg.shared_expert_intermediate_size),
        )

    def _shard_sizes(self) -> dict[str, list[int]]:
        sizes = super()._shard_sizes()
        sizes["gate_up_proj"] = [self.config.shared_expert_intermediate_size] * 2  # shared expert
        return sizes

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    ) -> None:
        """The experts load here, in either naming; every other weight as in Qwen3.5's loader.
        A missing expert, or one past num_experts, is an error that names it."""
        cfg = self.config
        experts = ExpertWeights(self.layers, list(range(cfg.num_layers)), cfg.num_experts, copy)
        prefix = TEXT_PREFIXES[-1]

        def others() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal prefix
            for name, tensor in weights:
                start = next((p for p in TEXT_PREFIXES if name.startswith(p)), "")
                if experts.take(name, name[len(start) :], tensor):
                    prefix = start or prefix
                else:
                    yield name, tensor

        super().load_weights(others(), copy, loaded_elsewhere=experts.stacked)
        experts.check_complete(prefix)
