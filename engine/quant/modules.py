"""Quantized modules and the swap that puts them in a model: QuantLinear (int8 per row, int4
NF4/FP4 per group), QuantEmbedding (a lookup from a QuantLinear's rows) and quantize_model.

bitsandbytes quantizes (engine/quant/bnb.py); each QuantLinear keeps the values in our layout
(engine/quant/weight_format.py) and computes by the row-count table of engine/quant/dispatch.py,
with the kernels start-up timing chose for it (`kernels`). Embeddings and the LM head stay in 16
bits unless asked (WeightQuant.embeddings).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.quant.bnb import code_table, quantize_4bit, quantize_int8
from engine.quant.dispatch import QuantKernels, fused_silu, quant_linear
from engine.quant.reference import dequantize_ref, dequantize_to
from engine.quant.weight_format import QuantizedWeight, WeightQuant, check_int4_group

QUANTIZED_LINEARS = (
    *("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    *("in_proj_qkvz", "in_proj_ba", "out_proj"),  # Qwen3.5's Gated DeltaNet layers
)
"""Our (fused) projection names whose weights are quantized (ModelConfig.param_counts counts
them as `linear`)."""


class QuantLinear(nn.Module):
    """A linear layer with int8 or int4 weights; `bias` stays in the activation dtype."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        quant: WeightQuant,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.group_size = quant.group_size
        is_int4 = quant.kind == "int4"
        if is_int4:
            check_int4_group(quant.group_size, [in_features])
        qshape = (out_features, in_features // 2) if is_int4 else (out_features, in_features)
        sshape = (out_features, in_features // quant.group_size) if is_int4 else (out_features,)
        qdtype = torch.uint8 if is_int4 else torch.int8

        def frozen(shape, dt):
            return nn.Parameter(torch.zeros(shape, dtype=dt, device=device), requires_grad=False)

        self.qweight = frozen(qshape, qdtype)
        self.scales = frozen(sshape, torch.float32)
        self.bias = frozen((out_features,), dtype) if bias else None
        code = code_table(quant.quant_type).to(device) if is_int4 else None
        self.register_buffer("code", code, persistent=False)
        self.kernels = QuantKernels()
        """The kernels start-up timing chose for this weight (engine/quant/quant_choices.py)."""

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, quant: WeightQuant) -> QuantLinear:
        w = linear.weight
        layer = cls(w.shape[1], w.shape[0], linear.bias is not None, quant, w.dtype, w.device)
        if quant.kind == "int4":
            q, s = quantize_4bit(w, quant.group_size, quant.quant_type)
        else:
            q, s = quantize_int8(w)
        layer.qweight.copy_(q)
        layer.scales.copy_(s)
        if linear.bias is not None:
            layer.bias.copy_(linear.bias)
        return layer

    @property
    def quantized(self) -> QuantizedWeight:
        """The weight and bias as one QuantizedWeight (the module's current tensors)."""
        return QuantizedWeight(self.qweight, self.scales, self.code, self.bias, self.group_size)

    def dequantize(self) -> torch.Tensor:
        """The weight as fp32 [out_features, in_features]."""
        return dequantize_ref(self.qweight, self.scales, self.code, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear(x, self.quantized, self.kernels)

    def fused_silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu_and_mul(self(x)) in one kernel for a gate-and-up projection, where start-up
        timing found it faster than the two steps; None: the caller runs the two steps."""
        return fused_silu(x, self.quantized, self.kernels)

    def extra_repr(self) -> str:
        kind = "int4" if self.code is not None else "int8"
        return f"{self.in_features} -> {self.out_features}, {kind}, group={self.group_size}"


class QuantEmbedding(nn.Module):
    """An embedding lookup from a QuantLinear's rows, dequantized per looked-up token."""

    def __init__(self, table: QuantLinear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table, self.dtype = table, dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        t = self.table
        q, scales = t.qweight[input_ids], t.scales[input_ids]
        return dequantize_to(q, scales, t.code, t.group_size, self.dtype)


@torch.no_grad()
def quantize_model(
    model: nn.Module,
    quant: WeightQuant,
    device: torch.device | str,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
) -> None:
    """Replace every projection named in QUANTIZED_LINEARS by a QuantLinear on `device`, one at
    a time: `prepare` brings the 16-bit linear onto `device` (moved there, or drawn there), it is
    quantized, and its 16-bit weight is freed before the next one comes. So `device` holds at
    most one projection in 16 bits. Without `prepare` the QuantLinears are left empty (zeros),
    for checkpoints already quantized. Mixture-of-experts blocks (modules with
    `quantize_experts`, engine/models/moe_block.py) come to `device` through `prepare` too, one
    block at a time, and quantize their stacked experts there."""
    embeddings = quant.embeddings and prepare is not None
    if embeddings and model.config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight  # the tie may not survive materialising
    wanted = QUANTIZED_LINEARS + (("lm_head",) if embeddings else ())
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in wanted
    ]
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, attr)
        if prepare is None:
            n, k = linear.weight.shape
            dtype = linear.weight.dtype
            layer = QuantLinear(k, n, linear.bias is not None, quant, dtype, device)
        else:
            layer = QuantLinear.from_linear(prepare(linear), quant)
        setattr(parent, attr, layer)
        del linear  # the last reference to the 16-bit weight
    experts = [m for m in model.modules() if hasattr(m, "quantize_experts")]
    if experts and prepare is None:
        raise ValueError(
            "a checkpoint bitsandbytes already quantized has no experts this engine reads; "
            "load the 16-bit checkpoint with quantization int8 or int4"
        )
    for block in experts:
        prepare(block).quantize_experts(quant)
    if embeddings:
        _quantize_embeddings(model, quant, prepare)
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _quantize_embeddings(model: nn.Module, quant: WeightQuant, prepare) -> None:
    """Swap embed_tokens for a QuantEmbedding: the (quantized) LM head's rows when the pair is
    tied, else its own quantized copy."""
    embedding = model.embed_tokens
    if model.config.tie_word_embeddings:
        table = model.lm_head
    else:
        as_linear = nn.Linear(1, 1, bias=False, device="meta")
        as_linear.weight = embedding.weight  # [vocab, hidden]: rows are what a lookup reads
        table = QuantLinear.from_linear(prepare(as_linear), quant)
    model.embed_tokens = QuantEmbedding(table, embedding.weight.dtype)
