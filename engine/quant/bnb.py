"""bitsandbytes, imported lazily (only when quantization is asked): its quantizers and 4-bit
code tables, and the reader of checkpoints it already quantized, all into our layout
(engine/quant/weight_format.py).

Checkpoints (save_pretrained of a model transformers loaded with BitsAndBytesConfig; which one
config.json describes is checkpoints.checkpoint_quant's job):
- INT8 (LLM.int8): `<proj>.weight` int8 [N, K], `<proj>.SCB` fp32 [N] (row absmax),
  `<proj>.weight_format`.
- 4-bit: `<proj>.weight` uint8 [N * K / 2, 1], `<proj>.weight.absmax`, `.quant_map`,
  `.quant_state.bitsandbytes__<type>` (JSON: blocksize, shape, ...) and, with double
  quantization, `.nested_absmax` / `.nested_quant_map`.
Each becomes `<proj>.qweight` + `<proj>.scales`, which the model's loader fuses like any weight
(rows of Q/K/V, gate/up).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator

import torch

from engine import library_logs
from engine.quant.weight_format import (
    BNB_INSTALL,
    WeightQuant,
    check_int4_group,
    split_projection,
)

log = logging.getLogger(__name__)
_STATE_KEY = ".weight.quant_state.bitsandbytes__"


def bnb_functional():
    library_logs.quiet("bitsandbytes")  # before its import, which logs about optional kernels
    try:
        import bitsandbytes.functional as bnb_f
    except ImportError as e:
        raise ValueError(f"quantization int8/int4 needs bitsandbytes: {BNB_INSTALL}") from e
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
    check_int4_group(group_size, [k])
    bnb_f = bnb_functional()

    def quantize(t: torch.Tensor):
        q, state = bnb_f.quantize_4bit(t.contiguous(), blocksize=group_size, quant_type=quant_type)
        return q, state.absmax

    q, absmax = _on_device_or_cpu(quantize, w)
    return q.view(n, k // 2), absmax.float().view(n, k // group_size)


# --- checkpoints bitsandbytes quantized ----------------------------------------------------


def convert_bnb_weights(
    weights: Iterable[tuple[str, torch.Tensor]], quant: WeightQuant
) -> Iterator[tuple[str, torch.Tensor]]:
    """Hugging Face-named tensors of a bitsandbytes checkpoint -> our names: each quantized
    projection yields `<proj>.qweight` and `<proj>.scales` (int8 scale = SCB / 127); other
    tensors (norms, embeddings, LM head, biases) pass through."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    done: set[str] = set()
    for name, tensor in weights:
        split = split_projection(name)
        if split is None or split[1] == "bias":
            yield name, tensor
            continue
        prefix, part = split
        if prefix in done:  # an auxiliary part after the weight was complete (weight_format)
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if _is_complete(parts, quant):
            done.add(prefix)
            yield from _emit(prefix, pending.pop(prefix), quant)
    if pending:
        prefix, parts = next(iter(pending.items()))
        raise ValueError(
            f"checkpoint is missing parts of quantized weight {prefix!r} (has {sorted(parts)})"
        )


def _is_complete(parts: dict[str, torch.Tensor], quant: WeightQuant) -> bool:
    if quant.kind == "int8":
        return {"weight", "SCB"} <= parts.keys()
    state = next((k for k in parts if k.startswith(_STATE_KEY[1:])), None)
    if state is None or not {"weight", "weight.absmax"} <= parts.keys():
        return False
    nested = "nested_blocksize" in _state_json(parts[state])
    return not nested or {"weight.nested_absmax", "weight.nested_quant_map"} <= parts.keys()


def _state_json(t: torch.Tensor) -> dict:
    return json.loads(bytes(t.to(torch.uint8).tolist()).decode())


def _emit(prefix: str, parts: dict, quant: WeightQuant) -> Iterator[tuple[str, torch.Tensor]]:
    weight = parts["weight"]
    if quant.kind == "int8":
        if weight.dtype != torch.int8:
            raise ValueError(f"{prefix}.weight is {weight.dtype}, expected int8 (load_in_8bit)")
        yield f"{prefix}.qweight", weight
        yield f"{prefix}.scales", parts["SCB"].float() / 127.0
        return
    qweight, absmax = _convert_4bit(prefix, parts, quant)
    yield f"{prefix}.qweight", qweight
    yield f"{prefix}.scales", absmax


def _convert_4bit(prefix: str, parts: dict, quant: WeightQuant) -> tuple[torch.Tensor, ...]:
    state_key = next(k for k in parts if k.startswith(_STATE_KEY[1:]))
    info = _state_json(parts[state_key])
    n, k = info["shape"]
    if info["blocksize"] != quant.group_size:
        raise ValueError(
            f"{prefix}: the checkpoint's 4-bit blocks hold {info['blocksize']} weights; "
            f"set quant_block_size={info['blocksize']}"
        )
    check_int4_group(quant.group_size, [k])
    if info["quant_type"] != quant.quant_type:
        raise ValueError(f"{prefix}: quant_type {info['quant_type']!r} != {quant.quant_type!r}")
    if "weight.quant_map" in parts and not torch.allclose(
        parts["weight.quant_map"].float(), code_table(quant.quant_type), atol=1e-6
    ):
        raise ValueError(f"{prefix}: its quant_map is not the standard {quant.quant_type} table")
    absmax = parts["weight.absmax"]
    if "nested_blocksize" in info:  # double quantization: the absmax are themselves 8-bit
        bnb_f = bnb_functional()
        qs = {k.removeprefix("weight."): v for k, v in parts.items() if k != "weight"}
        state = bnb_f.QuantState.from_dict(qs, device=torch.device("cpu"))
        absmax = bnb_f.dequantize_blockwise(state.absmax, state.state2) + state.offset
    qweight = parts["weight"].view(torch.uint8).reshape(n, k // 2)
    return qweight, absmax.float().reshape(n, k // quant.group_size)
