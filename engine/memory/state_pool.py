"""StatePool: the fixed-size state every sequence keeps in each linear-attention (LINEAR) layer,
in slots beside the paged KV cache, and SlotAllocator, the free list of those slots the block
manager hands out.

Per LINEAR layer (the layout engine/kernels/gdn_args.py documents):
- conv state [num_slots, conv_dim, conv_kernel - 1] in the activation dtype: the last
  conv_kernel - 1 inputs of the layer's causal convolution;
- recurrent state [num_slots, num_value_heads, key_head_dim, value_head_dim] in float32
  (RECURRENT_STATE_DTYPE): the gated delta rule's matrix, which integrates every token.
All layers' states of one kind live in one tensor [num_linear_layers, num_slots, ...]; each
layer is bound to its views. A sequence holds one slot from admission (its first prefill
chunk) until it finishes, is aborted or is preempted; a sequence starting over (first chunk,
or re-prefill after preemption by recompute) starts from a zero state (the `fresh` flag of the
step's metadata), so a slot needs no clearing. CUDA-graph padding rows take slot -1, which the
kernels neither read nor write, so no spare slot is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.model_config import ModelConfig

RECURRENT_STATE_DTYPE = torch.float32
"""The recurrent state's dtype, whatever the activations' (engine/kernels/gdn_args.py)."""
STATE_TENSORS = ("conv_state", "recurrent_state")
"""A linear-attention layer's attributes that hold views of the pool."""


class SlotAllocator:
    """The free list of state slots: one per running sequence, at most num_slots at once
    (the engine sizes it to max_num_seqs)."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"a state pool needs at least one slot, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() gives slot 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def take(self) -> int | None:
        """A free slot, or None when every slot is in use."""
        return self._free.pop() if self._free else None

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise RuntimeError(f"state slot {slot} freed twice or never taken")
        self._free.append(slot)


@dataclass
class StatePool:
    conv: torch.Tensor
    """[num_linear_layers, num_slots, conv_dim, conv_kernel - 1], activation dtype."""
    recurrent: torch.Tensor
    """[num_linear_layers, num_slots, num_value_heads, key_head_dim, value_head_dim], fp32."""

    @classmethod
    def empty(cls) -> StatePool:
        return cls(torch.empty(0, 0, 0, 0), torch.empty(0, 0, 0, 0, 0))

    @classmethod
    def allocate(
        cls,
        cfg: ModelConfig,
        layers: list,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> StatePool:
        """Allocate (zeroed) the states of num_slots sequences in every LINEAR layer and bind
        each of `layers` (the model's linear-attention modules, in layer order:
        cfg.linear_layer_ids()) to its views; the conv state in `dtype` (the activations')."""
        shape, ids = cfg.linear_attention, cfg.linear_layer_ids()
        if shape is None or not ids:
            raise ValueError("the model has no linear-attention layers: it keeps no state pool")
        if len(layers) != len(ids):
            raise ValueError(
                f"the model has {len(layers)} linear-attention layers, its config {len(ids)}"
            )
        n = len(ids)
        conv = torch.zeros(
            n, num_slots, shape.conv_dim, shape.conv_kernel - 1, dtype=dtype, device=device
        )
        recurrent = torch.zeros(
            n,
            num_slots,
            shape.num_value_heads,
            shape.key_head_dim,
            shape.value_head_dim,
            dtype=RECURRENT_STATE_DTYPE,
            device=device,
        )
        for i, layer in enumerate(layers):
            layer.conv_state, layer.recurrent_state = conv[i], recurrent[i]
        return cls(conv, recurrent)

    @property
    def num_slots(self) -> int:
        return self.conv.shape[1]

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes

    @staticmethod
    def unbind(layers: list) -> None:
        """Drop every layer's reference to the pool's views."""
        for layer in layers:
            for name in STATE_TENSORS:
                setattr(layer, name, None)
