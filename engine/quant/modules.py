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
    """A linear layer with int8, int4 or fp8 weights (engine/quant/weight_format.py); `bias`
    stays in the activation dtype. Weights read from a checkpoint may carry zero points
    (`zeros`) and an input order (`perm`, set by set_input_order)."""

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
        n, k = out_features, in_features
        group = self.group_size = quant.group_size or k  # 0: one group of the whole row
        read = quant.method not in ("", "bitsandbytes")  # a checkpoint's own groups
        if quant.kind == "int4" and not read:
            check_int4_group(group, [k])
        elif k % group and quant.kind != "fp8":
            raise ValueError(f"groups of {group} weights do not divide the input size {k}")
        if quant.kind == "int4":
            qshape, qdtype, sshape = (n, k // 2), torch.uint8, (n, k // group)
        elif quant.kind == "fp8":
            qshape, qdtype, sshape = (n, k), torch.float8_e4m3fn, (n, -(-k // group))
        else:
            grouped = read and (quant.group_size > 0 or quant.zero_points)
            qshape, qdtype, sshape = (n, k), torch.int8, (n, k // group) if grouped else (n,)

        def frozen(shape, dt):
            return nn.Parameter(torch.zeros(shape, dtype=dt, device=device), requires_grad=False)

        self.qweight = frozen(qshape, qdtype)
        self.scales = frozen(sshape, torch.float32)
        self.zeros = frozen(sshape, torch.float32) if quant.zero_points else None
        self.bias = frozen((out_features,), dtype) if bias else None
        code = _code_table(quant.quant_type).to(device) if quant.kind == "int4" else None
        self.register_buffer("code", code, persistent=False)
        self.register_buffer("perm", None, persistent=False)
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
        return QuantizedWeight(
            self.qweight, self.scales, self.code, self.bias, self.group_size, self.zeros, self.perm
        )

    @torch.no_grad()
    def set_input_order(self, perm: torch.Tensor) -> None:
        """Read x's columns in `perm`'s order (int64 [in_features]): the order a GPTQ desc_act
        checkpoint stored them in. Fused projections (Q/K/V, gate/up) share one input, so each
        shard must bring the same order."""
        perm = perm.to(device=self.qweight.device, dtype=torch.int64)
        if self.perm is not None and not torch.equal(self.perm, perm):
            raise ValueError(
                "the fused projections' desc_act orders (g_idx) differ; a checkpoint whose "
                "Q/K/V or gate/up projections order their shared input differently is not read"
            )
        self.perm = perm

    def dequantize(self) -> torch.Tensor:
        """The weight as fp32 [out_features, in_features], in the natural input order."""
        w = dequantize_ref(self.qweight, self.scales, self.code, self.group_size, self.zeros)
        if self.perm is None:
            return w
        natural = torch.empty_like(w)
        natural[:, self.perm] = w
        return natural

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear(x, self.quantized, self.kernels)

    def fused_silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu_and_mul(self(x)) in one kernel for a gate-and-up projection, where start-up
        timing found it faster than the two steps; None: the caller runs the two steps."""
        return fused_silu(x, self.quantized, self.kernels)

    def extra_repr(self) -> str:
        kind = self.quantized.kind + (" with zero points" if self.zeros is not None else "")
        return f"{self.in_features} -> {self.out_features}, {kind}, group={self.group_size}"


def _code_table(quant_type: str) -> torch.Tensor:
    """The fp32 [16] values of the 4-bit codes: bitsandbytes' NF4 or FP4 table, or the integers
    of a checkpoint's codes: "int" (symmetric) -8..7, "uint" (less a zero point) 0..15."""
    if quant_type == "int":
        return torch.arange(-8, 8, dtype=torch.float32)
    if quant_type == "uint":
        return torch.arange(16, dtype=torch.float32)
    return code_table(quant_type)


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
    names = [  # the text model's: a vision encoder (`vision.`) stays in 16 bits
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and name.rsplit(".", 1)[-1] in wanted
        and not name.startswith("vision.")
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
