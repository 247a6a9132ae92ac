"""The quantized-weight format: how a model's linear weights are stored (WeightQuant), one
quantized weight (QuantizedWeight) and the int4 group-size rule. Torch-free at import. Which
checkpoints are read, and the engine settings resolved to a WeightQuant:
engine/quant/checkpoints.py.

Layout (our own shapes; the kernels in engine/kernels read int8 per row and int4 without zero
points; the other variants take the pure-PyTorch path of engine/quant/dispatch.py):
- int8: qweight int8 [N, K], scales fp32 [N]: W[n, k] = qweight[n, k] * scales[n]; or, read
  from a checkpoint with groups, scales [N, K / group]: W[n, k] = qweight[n, k] * scales[n, g]
  with g = k // group.
- int4: qweight uint8 [N, K / 2], two codes a byte (k even in the high nibble), scales fp32
  [N, K / group], code fp32 [16] (the NF4 or FP4 table, or the integers -8..7 or 0..15):
  W[n, k] = code[nibble(n, k)] * scales[n, g].
- zero points (int4 and int8 read from AWQ, GPTQ or compressed-tensors asymmetric
  checkpoints): zeros fp32 [N, K / group], W[n, k] = (code-or-int8 - zeros[n, g]) * scales[n, g].
- fp8: qweight float8_e4m3fn [N, K], scales fp32 [N, ceil(K / group)] (a per-channel scale is
  one group of the whole row; a 128 x 128 block scale is repeated on each of its 128 rows):
  W[n, k] = float(qweight[n, k]) * scales[n, g].
- perm (GPTQ with desc_act): int64 [K], the input order the grouped columns were stored in:
  x @ W.T = x[..., perm] @ Wp.T where Wp = W[:, perm] is what qweight holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

QUANT_KINDS = ("int8", "int4", "fp8")
"""The stored weight kinds (the planner's bytes: engine/planner/formulas.FORMAT_BITS)."""
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""A checkpoint's (Hugging Face-named) projections whose weights are stored quantized."""
BNB_INSTALL = "pip install bitsandbytes==0.50.2"
BNB_4BIT_BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
"""Block sizes bitsandbytes' 4-bit quantizer accepts."""


@dataclass(frozen=True)
class WeightQuant:
    """How linear weights are stored: kind "int8", "int4" or "fp8" (QUANT_KINDS), with one
    scale per `group_size` weights of a row (0: one per row). Quantized at load by
    bitsandbytes (method ""): int8 per row, int4 with quant_type "nf4" or "fp4". Read from a
    quantized checkpoint (method one of engine/quant/checkpoints.CHECKPOINT_METHODS): int4
    with quant_type "int" (codes -8..7, symmetric) or "uint" (codes 0..15 less a zero point
    per group), int8 likewise, or fp8."""

    kind: str
    group_size: int = 64
    quant_type: str = "nf4"
    method: str = ""
    """The checkpoint's quantization_config quant_method ("bitsandbytes", "awq", "gptq",
    "compressed-tensors", "fp8"): its weights are read, never re-quantized. "": quantized at
    load."""
    embeddings: bool = False
    """Quantize the LM head and the input embeddings too (a tied pair shares one copy)."""
    variant: str = ""
    """How the method stored them, as the converter (engine/quant/formats) needs it:
    gptq "v1" (zero points stored less one) or "v2"; compressed-tensors "pack-quantized" or
    "float-quantized"; fp8 block scales "block:ROWSxCOLS", per channel "channel"."""

    @property
    def prequantized(self) -> bool:
        """The checkpoint already holds quantized weights (read, not re-quantized)."""
        return bool(self.method)

    @property
    def zero_points(self) -> bool:
        """Each scale group has a zero point (quant_type "uint")."""
        return self.quant_type == "uint"


@dataclass(slots=True, eq=False)
class QuantizedWeight:
    """One quantized linear weight and its bias, in the layout of the module docstring. Kernels
    take its tensors as plain arguments (kernel_args), never this type."""

    qweight: torch.Tensor
    """int8 [N, K], packed int4 uint8 [N, K / 2], or float8_e4m3fn [N, K]."""
    scales: torch.Tensor
    """fp32 [N] (int8 per row) or [N, groups]."""
    code: torch.Tensor | None
    """int4: the fp32 [16] table a 4-bit code stands for; None for int8 and fp8."""
    bias: torch.Tensor | None
    """[N] in the activation dtype, or None."""
    group_size: int
    """Weights per scale group along a row (int8 with [N] scales does not read it)."""
    zeros: torch.Tensor | None = None
    """fp32 [N, groups]: each group's zero point, subtracted from the code before scaling; None
    where the format is symmetric."""
    perm: torch.Tensor | None = None
    """int64 [K]: the input order of qweight's columns (GPTQ desc_act); None: the natural one."""

    @property
    def kind(self) -> str:
        if self.code is not None:
            return "int4"
        return "fp8" if self.qweight.is_floating_point() else "int8"

    @property
    def is_kernel_layout(self) -> bool:
        """The Triton kernels read it: int8 with row scales or int4, neither with zero points.
        (perm is applied to x first, so it does not matter here.)"""
        if self.zeros is not None or self.kind == "fp8":
            return False
        return self.kind == "int4" or self.scales.dim() == 1

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * (1 if self.code is None else 2)

    def kernel_args(self) -> tuple:
        """(qweight, scales, code, bias, group_size): the weight arguments, in the order every
        quantized kernel wrapper and reference takes them (zeros and perm: by keyword to the
        references only)."""
        return self.qweight, self.scales, self.code, self.bias, self.group_size


def split_projection(name: str) -> tuple[str, str] | None:
    """A checkpoint tensor of a quantized projection -> (the projection's name, the part):
    '…q_proj.weight.absmax' -> ('…q_proj', 'weight.absmax'); None for other tensors."""
    for proj in PROJECTIONS:
        marker = f".{proj}."
        if marker in name:
            head, _, tail = name.partition(marker)
            return head + marker[:-1], tail
    return None


def check_int4_group(group_size: int, in_features: Iterable[int]) -> None:
    """The int4 group-size rule, for whatever quantizes or reads int4 weights: bitsandbytes
    quantizes in blocks of BNB_4BIT_BLOCKS weights, and a group must divide every input width
    (a row is whole groups). Raises ValueError naming the setting to change."""
    if group_size not in BNB_4BIT_BLOCKS:
        raise ValueError(
            f"quant_block_size={group_size}: bitsandbytes quantizes 4-bit weights in "
            f"blocks of {', '.join(map(str, BNB_4BIT_BLOCKS))}; pick one of those (64 is usual)"
        )
    sizes = sorted(set(in_features))
    bad = [s for s in sizes if s % group_size]
    if bad:
        raise ValueError(
            f"quant_block_size={group_size} must divide the layers' input sizes {sizes} "
            f"(not {bad}); pick a divisor such as 32 or 64"
        )
