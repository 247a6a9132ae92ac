"""Weight-only quantized linear layers (INT8 per-row, INT4 NF4 per-group) and the model swap.

bitsandbytes quantizes (imported lazily: only when quantization is asked); we keep its values
in our own layout (engine/kernels/wq_gemv.py documents it) and compute with the Triton kernel
on CUDA, or with the pure-PyTorch reference here (dequantize, then matmul) elsewhere.
Embeddings and the LM head stay in 16 bits unless asked (WeightQuant.embeddings).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import silu_and_mul

log = logging.getLogger(__name__)

QUANTIZED_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
"""Our (fused) projection names whose weights are quantized."""


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


def bnb_functional():
    try:
        import bitsandbytes.functional as bnb_f
    except ImportError as e:
        raise ValueError(
            "quantization int8/int4 needs bitsandbytes: pip install bitsandbytes==0.50.2"
        ) from e
    return bnb_f


def code_table(quant_type: str) -> torch.Tensor:
    """The 16 values a 4-bit code stands for (bitsandbytes' NF4 or FP4 table), fp32."""
    return bnb_functional().get_4bit_type(quant_type, device="cpu").float()


def _on_device_or_cpu(fn, w: torch.Tensor):
    """Run a bitsandbytes quantizer on w's device; fall back to the CPU backend (with a
    warning) when the device backend is missing, e.g. a wheel without this CUDA's binary."""
    try:
        return fn(w)
    except (RuntimeError, NotImplementedError) as e:
        if w.device.type == "cpu":
            raise
        log.warning("bitsandbytes failed on %s (%s); quantizing on the CPU", w.device, e)
        return tuple(t.to(w.device) if torch.is_tensor(t) else t for t in fn(w.cpu()))


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (int8 [N, K], fp32 scales [N]) with W ~ q * scale (LLM.int8's rows)."""
    bnb_f = bnb_functional()
    # bitsandbytes' CUDA int8 quantizer takes fp16 only (weights are far inside its range)
    w = w.half() if w.device.type == "cuda" else w
    q, row_absmax, _ = _on_device_or_cpu(lambda t: bnb_f.int8_vectorwise_quant(t, 0.0), w)
    return q.contiguous(), (row_absmax.float() / 127.0).contiguous()


def quantize_4bit(
    w: torch.Tensor, group_size: int, quant_type: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (uint8 [N, K / 2], fp32 absmax [N, K / group_size])."""
    n, k = w.shape
    if k % group_size:
        raise ValueError(
            f"int4 needs in_features ({k}) to be a multiple of quant_block_size ({group_size})"
        )
    bnb_f = bnb_functional()

    def quantize(t: torch.Tensor):
        q, state = bnb_f.quantize_4bit(t.contiguous(), blocksize=group_size, quant_type=quant_type)
        return q, state.absmax

    q, absmax = _on_device_or_cpu(quantize, w)
    return q.view(n, k // 2), absmax.float().view(n, k // group_size)


def dequantize_ref(
    qweight: torch.Tensor, scales: torch.Tensor, code: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """Pure-PyTorch dequantization to fp32 [N, K] (the kernel's reference)."""
    return dequantize_to(qweight, scales, code, group_size, torch.float32)


def dequantize_to(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    code: torch.Tensor | None,
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The weight as `dtype` [N, K]: each product code-or-int8 x scale computed in fp32 and
    rounded once as it is written (int8: no fp32 copy at all; int4: one, for the looked-up
    codes). Batches of more than a few rows take this path on a GPU before cuBLAS, so its
    temporaries are the layer's activation peak."""
    if qweight.dtype == torch.int8:
        out = torch.empty(qweight.shape, dtype=dtype, device=qweight.device)
        return torch.mul(qweight, scales[:, None], out=out)
    n, groups = scales.shape
    # byte b -> (code[b >> 4], code[b & 15]): one lookup yields both weights of a byte
    pairs = torch.stack([code.repeat_interleave(16), code.repeat(16)], dim=-1)  # [256, 2]
    values = pairs[qweight.int()].view(n, groups, group_size)  # [N, K / group, group]
    out = torch.empty(values.shape, dtype=dtype, device=qweight.device)
    return torch.mul(values, scales[:, :, None], out=out).view(n, -1)


def wq_matmul_ref(x, qweight, scales, code=None, bias=None, group_size: int = 64):
    """x @ dequant(W).T + bias, with the weight rounded to x's dtype (as bitsandbytes does)."""
    w = dequantize_to(qweight, scales, code, group_size, x.dtype)
    return F.linear(x, w, bias)


DEQUANT_MIN_ROWS = 16
"""Above this many rows a CUDA quantized linear without the decode-batch GEMM (prefill, or
where start-up timing did not keep it) dequantizes to 16 bits and calls cuBLAS."""


def linear_without_gemm(x: torch.Tensor, layer: tuple) -> torch.Tensor:
    """x @ dequant(W).T + bias for layer (qweight, scales, code, bias, group_size) where the
    decode-batch GEMM (engine/kernels/wq_gemm.py) is not used: many rows (prefill) dequantize
    once and let cuBLAS run the GEMM (the tl.dot path measured far slower there, H200); fewer
    take the Triton kernel of wq_gemv (one row: the split-K GEMV); off CUDA the reference."""
    qweight, scales, code, bias, group_size = layer
    if x.is_cuda and x.numel() // x.shape[-1] > DEQUANT_MIN_ROWS:
        if _kernel_enabled():
            from engine.kernels.dequant import weight_for

            return F.linear(x, weight_for(qweight, scales, code, group_size, x.dtype), bias)
        return F.linear(x, dequantize_to(qweight, scales, code, group_size, x.dtype), bias)
    if x.is_cuda and _kernel_enabled():
        from engine.kernels.wq_gemv import wq_matmul

        return wq_matmul(x, *layer)
    return wq_matmul_ref(x, *layer)


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
        if is_int4 and (in_features % quant.group_size or quant.group_size % 2):
            raise ValueError(
                f"int4 needs in_features ({in_features}) to be a multiple of the even "
                f"quant_block_size ({quant.group_size})"
            )
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

    def dequantize(self) -> torch.Tensor:
        """The weight as fp32 [out_features, in_features]."""
        return dequantize_ref(self.qweight, self.scales, self.code, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = (self.qweight, self.scales, self.code, self.bias, self.group_size)
        if x.is_cuda and x.numel() > x.shape[-1] and _kernel_enabled():
            # Decode batches: the dequantizing GEMM where start-up timing kept it for this
            # shape and row bucket
            from engine.kernels.wq_gemm import gemm_for

            out = gemm_for(x, layer)
            if out is not None:
                return out
        return linear_without_gemm(x, layer)

    def silu_mul_forward(self, x: torch.Tensor) -> torch.Tensor:
        """silu_and_mul(self(x)) for a gate-and-up projection: one fused kernel at batch 1
        where choose_quant_linears timed it faster than the two steps, else the two."""
        if x.is_cuda and x.dim() == 2 and x.shape[0] == 1 and _kernel_enabled():
            from engine.kernels.wq_choice import silu_config_for
            from engine.kernels.wq_splitk import wq_gemv_silu

            layer = (self.qweight, self.scales, self.code, self.bias, self.group_size)
            config = silu_config_for(layer, x)
            if config is not None:
                out = wq_gemv_silu(x, *layer, config)
                if out is not None:
                    return out
        return silu_and_mul(self(x))

    def extra_repr(self) -> str:
        kind = "int4" if self.code is not None else "int8"
        return f"{self.in_features} -> {self.out_features}, {kind}, group={self.group_size}"


def choose_quant_linears(model: nn.Module, dtype: torch.dtype, max_rows: int = 1) -> None:
    """Time the batch-1 split-K kernel's configs for each QuantLinear shape of the model, over
    its own weights, so decode graphs capture the fastest; the Triton dequantization of
    batches against PyTorch's; and, for batches of up to max_rows (decode), the dequantizing
    GEMM against linear_without_gemm (CUDA only; before capturing)."""
    named = [
        (name, (m.qweight, m.scales, m.code, m.bias, m.group_size))
        for name, m in model.named_modules()
        if isinstance(m, QuantLinear)
    ]
    if named and named[0][1][0].is_cuda and _kernel_enabled():
        from engine.kernels import dequant
        from engine.kernels.wq_choice import choose_configs, choose_silu

        dequant.choose([layer for _, layer in named], dtype)
        if max_rows > 1:
            from engine.kernels import wq_gemm

            wq_gemm.choose([layer for _, layer in named], dtype, max_rows)
        choose_configs([layer for _, layer in named], dtype)
        choose_silu([layer for name, layer in named if name.endswith("gate_up_proj")], dtype)


def _kernel_enabled() -> bool:
    from engine.kernels import triton_available

    return triton_available()


@torch.no_grad()
def quantize_model(
    model: nn.Module,
    quant: WeightQuant,
    device: torch.device | str,
    prepare: Callable[[nn.Linear], nn.Linear] | None = None,
) -> None:
    """Replace every projection named in QUANTIZED_LINEARS by a QuantLinear on `device`, one at
    a time: `prepare` brings the 16-bit linear onto `device` (moved there, or drawn there), it is
    quantized, and its 16-bit weight is freed before the next one comes. So `device` holds at
    most one projection in 16 bits. Without `prepare` the QuantLinears are left empty (zeros),
    for checkpoints already quantized."""
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


class QuantEmbedding(nn.Module):
    """An embedding lookup from a QuantLinear's rows, dequantized per looked-up token."""

    def __init__(self, table: QuantLinear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table, self.dtype = table, dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        t = self.table
        q, scales = t.qweight[input_ids], t.scales[input_ids]
        return dequantize_to(q, scales, t.code, t.group_size, self.dtype)
