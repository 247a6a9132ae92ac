"""ExpertWeights: a checkpoint's expert tensors loaded into the MoEBlocks' stacks, for the
families whose checkpoints name experts as Qwen-MoE's do (Qwen3-MoE, Qwen3.5-MoE).

Checkpoints name each expert (`layers.L.mlp.experts.N.{gate,up,down}_proj.weight`, as hub
checkpoints and transformers' save_pretrained write them) or hold them fused per layer
(`layers.L.mlp.experts.gate_up_proj` [E, 2I, H] and `.down_proj` [E, H, I], transformers' own
parameters); both load into MoEBlock's stacked `w_gate_up` (the gate's rows first) and
`w_down`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from engine.models.moe_block import MoEBlock
from engine.models.weights import check_shape, missing_error

EXPERT = re.compile(
    r"layers\.(\d+)\.mlp\.experts\.(?:(\d+)\.(gate_proj|up_proj|down_proj)\.weight"
    r"|(gate_up_proj|down_proj))"
)
"""An expert weight's name (the model prefix removed): per expert, or one layer's fused."""
SHARDS = {"gate_proj": ("w_gate_up", 0), "up_proj": ("w_gate_up", 1), "down_proj": ("w_down", 0)}
"""Per-expert checkpoint name -> (our stacked parameter, which half of its rows)."""


class ExpertWeights:
    """Loads the expert tensors of one checkpoint into `model.layers[L].mlp` (MoEBlocks) of the
    layers `moe_layers` names, and says which are missing at the end."""

    def __init__(
        self,
        layers,
        moe_layers: list[int],
        num_experts: int,
        copy: Callable[[torch.Tensor, torch.Tensor], object],
    ) -> None:
        self.layers, self.moe_layers, self.num_experts = layers, moe_layers, num_experts
        self.copy = copy
        self.loaded: set[tuple[int, int, str]] = set()
        """(layer, expert, checkpoint projection) of every expert weight loaded."""

    @property
    def stacked(self) -> set[str]:
        """Our stacked parameters' names, which load here, not by name."""
        return {f"layers.{i}.mlp.{p}" for i in self.moe_layers for p in ("w_gate_up", "w_down")}

    def take(self, name: str, short: str, tensor: torch.Tensor) -> bool:
        """Load `tensor` if `short` (`name` with the model prefix removed) names an expert
        weight; False for any other weight. An expert weight for a layer without experts or
        past num_experts is an error that names it."""
        match = EXPERT.fullmatch(short)
        if match is None:
            return False
        layer, expert, proj, fused = match.groups()
        block = self._block(int(layer), name)
        if fused is None:
            self._load_expert(block, name, int(expert), proj, tensor)
            self.loaded.add((int(layer), int(expert), proj))
            return True
        param = getattr(block, "w_gate_up" if fused == "gate_up_proj" else "w_down")
        check_shape(name, tensor, param)
        self.copy(param, tensor)
        projs = ("gate_proj", "up_proj") if fused == "gate_up_proj" else ("down_proj",)
        self.loaded.update((int(layer), e, p) for e in range(self.num_experts) for p in projs)
        return True

    def check_complete(self, prefix: str = "model.") -> None:
        """Raise naming the expert weights (as the checkpoint names them) never loaded."""
        missing = [
            f"{prefix}layers.{i}.mlp.experts.{e}.{p}.weight"
            for i in self.moe_layers
            for e in range(self.num_experts)
            for p in SHARDS
            if (i, e, p) not in self.loaded
        ]
        if missing:
            raise missing_error("checkpoint", missing, "expert weights")

    def _block(self, layer: int, name: str) -> MoEBlock:
        if layer not in self.moe_layers:
            raise ValueError(
                f"unexpected weight {name!r} in checkpoint: layer {layer} has no experts "
                f"(layers with experts: {self.moe_layers})"
            )
        return self.layers[layer].mlp

    def _load_expert(
        self, block: MoEBlock, name: str, expert: int, proj: str, tensor: torch.Tensor
    ) -> None:
        if expert >= block.num_experts:
            raise ValueError(
                f"unexpected weight {name!r} in checkpoint: the config has "
                f"num_experts={block.num_experts}"
            )
        stacked, half = SHARDS[proj]
        dst = getattr(block, stacked)[expert]  # [2 * inter, hidden] or [hidden, inter]
        if stacked == "w_gate_up":
            inter = block.intermediate_size
            dst = dst.narrow(0, half * inter, inter)  # [inter, hidden]
        check_shape(name, tensor, dst)
        self.copy(dst, tensor)
