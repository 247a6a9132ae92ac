"""Our Qwen3-MoE model: Qwen3's decoder (q/k RMSNorm attention) with a mixture-of-experts
block in place of the MLP where cfg.is_moe_layer(i), a dense MLP elsewhere.

The experts load per expert or fused per layer (engine/models/moe_weights.py); the router is
`layers.L.mlp.gate.weight`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from engine.models.llama import MLP, LlamaForCausalLM
from engine.models.moe_block import MoEBlock, softmax_topk, softmax_topk_renormalized
from engine.models.moe_weights import ExpertWeights


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    def make_mlp(self, layer: int) -> nn.Module:
        cfg = self.config
        if not cfg.is_moe_layer(layer):
            return MLP(cfg)
        rule = softmax_topk_renormalized if cfg.norm_topk_prob else softmax_topk
        return MoEBlock(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            rule,
        )

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    ) -> None:
        """The experts load here, in either naming (engine/models/moe_weights.py); every other
        weight as in Llama's loader. A missing expert, or an expert weight for a dense layer or
        past num_experts, is an error that names it."""
        cfg = self.config
        moe_layers = [i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)]
        experts = ExpertWeights(self.layers, moe_layers, cfg.num_experts, copy)

        def others() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if not experts.take(name, name.removeprefix("model."), tensor):
                    yield name, tensor

        super().load_weights(others(), copy, loaded_elsewhere=experts.stacked)
        experts.check_complete()
