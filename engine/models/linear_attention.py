"""LinearAttention: the shape of a linear-attention layer (Qwen3.5's Gated DeltaNet) and the
bytes of the state each sequence keeps for it. Torch-free (the planner reads it)."""

from __future__ import annotations

from dataclasses import dataclass

LINEAR = "linear_attention"
"""config.json's layer type of a linear-attention layer: a fixed-size state per sequence
(engine/memory/state_pool.py), no KV cache."""
RECURRENT_STATE_BYTES = 4
"""The recurrent state is float32 (the gated delta rule decays and adds into it every token);
the conv state keeps the activation dtype (it holds inputs, as they were)."""


@dataclass(frozen=True)
class LinearAttention:
    """A Gated DeltaNet layer's shape: q and k heads of key_head_dim, v heads of
    value_head_dim (num_value_heads a multiple of num_key_heads), and a causal depthwise
    convolution of conv_kernel taps over the q, k and v channels."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    def __post_init__(self) -> None:
        if min(self.num_key_heads, self.num_value_heads, self.key_head_dim) <= 0:
            raise ValueError(f"linear attention needs positive head counts and dims: {self}")
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(
                f"linear_num_value_heads {self.num_value_heads} must be a multiple of "
                f"linear_num_key_heads {self.num_key_heads}"
            )
        if self.conv_kernel < 2:
            raise ValueError(f"linear_conv_kernel_dim must be at least 2, got {self.conv_kernel}")

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels the convolution runs over: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    def conv_state_elements(self) -> int:
        """The last conv_kernel - 1 inputs of every channel."""
        return self.conv_dim * (self.conv_kernel - 1)

    def recurrent_state_elements(self) -> int:
        """One [key_head_dim, value_head_dim] matrix per value head."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim

    def state_bytes(self, recurrent_bytes: int, conv_bytes: int) -> int:
        """One sequence's state in this layer, with the given bytes per element of each."""
        return (
            self.recurrent_state_elements() * recurrent_bytes
            + self.conv_state_elements() * conv_bytes
        )
