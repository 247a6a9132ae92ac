"""The quantized-weight format: how a model's linear weights are stored (WeightQuant), one
quantized weight (QuantizedWeight), the int4 group-size rule, and the engine settings or a
checkpoint's quantization_config resolved to a WeightQuant. Torch-free at import.

Layout (bitsandbytes' values, kept in our own shapes; the kernels in engine/kernels read it):
- int8: qweight int8 [N, K], scales fp32 [N]: W[n, k] = qweight[n, k] * scales[n].
- int4: qweight uint8 [N, K / 2], two codes a byte (k even in the high nibble), scales fp32
  [N, K / group] (each group's absmax), code fp32 [16] (the NF4 or FP4 table):
  W[n, k] = code[nibble(n, k)] * scales[n, k // group].
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from engine.config import EngineConfig

BNB_INSTALL = "pip install bitsandbytes==0.50.2"
BNB_4BIT_BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
"""Block sizes bitsandbytes' 4-bit quantizer accepts."""


@dataclass(frozen=True)
class WeightQuant:
    """How linear weights are stored: kind "int8" (per-row absmax) or "int4" (4-bit codes with
    one absmax per `group_size` weights of a row); quant_type "nf4" or "fp4" for int4."""

    kind: str
    group_size: int = 64
    quant_type: str = "nf4"
    prequantized: bool = False
    """The checkpoint already holds bitsandbytes-quantized weights (read, not re-quantized)."""
    embeddings: bool = False
    """Quantize the LM head and the input embeddings too (a tied pair shares one copy)."""


@dataclass(slots=True, eq=False)
class QuantizedWeight:
    """One quantized linear weight and its bias, in the layout of the module docstring. Kernels
    take its tensors as plain arguments (kernel_args), never this type."""

    qweight: torch.Tensor
    """int8 [N, K], or packed int4 uint8 [N, K / 2]."""
    scales: torch.Tensor
    """fp32 [N] (int8) or [N, K / group_size] (int4)."""
    code: torch.Tensor | None
    """int4: the fp32 [16] table a 4-bit code stands for; None for int8."""
    bias: torch.Tensor | None
    """[N] in the activation dtype, or None."""
    group_size: int
    """int4: weights per scale group along a row (int8 does not read it)."""

    @property
    def kind(self) -> str:
        return "int8" if self.code is None else "int4"

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * (1 if self.code is None else 2)

    def kernel_args(self) -> tuple:
        """(qweight, scales, code, bias, group_size): the weight arguments, in the order every
        quantized kernel wrapper and reference takes them."""
        return self.qweight, self.scales, self.code, self.bias, self.group_size


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


class ModelShape(Protocol):
    """What resolve_weight_quant reads of a model's config
    (engine.models.model_config.ModelConfig)."""

    quantization_config: dict | None
    hidden_size: int
    intermediate_size: int
    num_heads: int
    head_dim: int
    moe_intermediate_size: int


def resolve_weight_quant(config: EngineConfig, model: ModelShape) -> WeightQuant | None:
    """How linear weights are stored: None = 16-bit (and for `auto`, which the planner resolves
    to a format before the model loads: engine.startup.planned_config.plan_engine). A
    checkpoint bitsandbytes quantized keeps its own format."""
    wanted = config.quantization
    quant = checkpoint_quant(model.quantization_config, config.quant_block_size)
    if quant is not None:
        if wanted not in ("none", "auto", quant.kind):
            raise ValueError(
                f"the checkpoint is already quantized ({quant.kind}, bitsandbytes); "
                f"quantization={wanted!r} cannot re-quantize it: use 'none' or {quant.kind!r}"
            )
    elif wanted in ("int8", "int4"):
        quant = WeightQuant(wanted, config.quant_block_size, embeddings=config.quantize_embeddings)
    elif config.quantize_embeddings:
        raise ValueError(
            "quantize_embeddings needs quantized weights: set quantization to int8 or int4"
        )
    else:
        return None
    if quant.kind == "int4":  # the projections' inputs: hidden, intermediate, attention output
        widths = [model.hidden_size, model.intermediate_size, model.num_heads * model.head_dim]
        widths += [model.moe_intermediate_size] if model.moe_intermediate_size else []  # w_down
        check_int4_group(quant.group_size, widths)
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(f"quantization {quant.kind} needs bitsandbytes: {BNB_INSTALL}")
    return quant


def checkpoint_quant(raw: dict | None, group_size: int) -> WeightQuant | None:
    """The WeightQuant a config.json quantization_config describes (None: not quantized);
    bitsandbytes' tensors themselves are read by engine/quant/bnb.py."""
    if not raw:
        return None
    method = raw.get("quant_method")
    if method != "bitsandbytes":
        raise ValueError(
            f"checkpoint quantization {method!r} is not supported; supported: bitsandbytes "
            "(load_in_8bit / load_in_4bit), or a 16-bit checkpoint with quantization=int8|int4"
        )
    if raw.get("load_in_8bit"):
        return WeightQuant("int8", group_size, prequantized=True)
    if raw.get("load_in_4bit"):
        storage = raw.get("bnb_4bit_quant_storage", "uint8")
        if storage != "uint8":
            raise ValueError(f"bnb_4bit_quant_storage={storage!r} is not supported; use uint8")
        quant_type = raw.get("bnb_4bit_quant_type", "fp4")
        if quant_type not in ("nf4", "fp4"):
            raise ValueError(f"bnb_4bit_quant_type={quant_type!r} is not supported")
        return WeightQuant("int4", group_size, quant_type, prequantized=True)
    raise ValueError("bitsandbytes quantization_config with neither load_in_8bit nor load_in_4bit")
