"""One planning pass's state (PlanPass) and its failure (Misfit); the stages that fill it are
engine/planner/budget.py (1-3) and engine/planner/sizing.py (4-7), run in order by
refusal.attempt. From a device budget and a model shape to engine settings, by arithmetic.

The budget splits as (docs/design.md, "Memory: the KV-cache formula and the planner"):

    budget    = total x utilization - memory other processes hold
    KV pool   = budget - weights - activation peak - CUDA graph pool - CUDA context
                - allocator cache - margin - state pool - vision weights and activations
                (a multimodal model's encoder: engine/planner/vision_bytes.py)
    KV blocks = KV pool // (block_size x KV bytes per token)
    KV bytes per token = 2 (K and V) x layers holding K/V x KV heads x head_dim x bytes
    state pool = max_num_seqs x state bytes per sequence (a hybrid model's linear layers:
                 fp32 recurrent state + conv state; 0 without linear layers)

Choices, in order, each with a one-line reason: the weight format (the best that leaves room for
target_num_seqs sequences of useful_context tokens), the KV dtype, the KV blocks,
max_model_len, max_num_seqs and max_num_batched_tokens, then the state pool's slots. Pinned
values are kept; pins that cannot fit raise PlanError naming one setting and the value to give
it (engine.planner.refusal).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.models.model_config import ModelConfig
from engine.planner.device import Device
from engine.planner.plan_request import PlanRequest

FORMAT_NAMES = {"none": None, "int8": "int8", "int4": "int4 (NF4)", "fp8": "fp8"}
"""How reasons name a weight format (None: the activation dtype's name)."""


class Misfit(Exception):
    """One planning pass failed; `stage` says how far it got (a later stage is progress)."""

    def __init__(self, stage: int, culprit: str, why: str, bound: object = None) -> None:
        super().__init__(why)
        self.stage, self.culprit, self.why = stage, culprit, why
        self.bound = bound
        """The culprit's own limit, suggested when no single change makes everything fit."""


@dataclass
class PlanPass:
    """One planning pass's state: inputs, then each stage's choices (set as attributes by the
    stages) and reasons."""

    m: ModelConfig
    dev: Device
    req: PlanRequest
    seqs_cap: int
    """The most sequences to plan: the pinned max_num_seqs, or the class's cap."""
    why: dict[str, str] = field(default_factory=dict)

    @property
    def bs(self) -> int:
        return self.req.block_size
