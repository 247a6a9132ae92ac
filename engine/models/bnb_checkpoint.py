"""Reading checkpoints that transformers + bitsandbytes already quantized (save_pretrained of a
model loaded with BitsAndBytesConfig): their config and their tensors, into our layout.

INT8 (LLM.int8): `<proj>.weight` int8 [N, K], `<proj>.SCB` fp32 [N] (row absmax),
`<proj>.weight_format`. 4-bit: `<proj>.weight` uint8 [N * K / 2, 1], `<proj>.weight.absmax`,
`.quant_map`, `.quant_state.bitsandbytes__<type>` (JSON: blocksize, shape, ...) and, with double
quantization, `.nested_absmax` / `.nested_quant_map`. Each becomes `<proj>.qweight` +
`<proj>.scales`, which the model's loader fuses like any weight (rows of Q/K/V, gate/up).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import torch

from engine.models.quant import WeightQuant, bnb_functional, code_table

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_STATE_KEY = ".weight.quant_state.bitsandbytes__"


def checkpoint_quant(raw: dict | None, group_size: int) -> WeightQuant | None:
    """The WeightQuant a config.json quantization_config describes (None: not quantized)."""
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


def _split(name: str) -> tuple[str, str] | None:
    """'…q_proj.weight.absmax' -> ('…q_proj', 'weight.absmax'); None for other tensors."""
    for proj in _PROJECTIONS:
        marker = f".{proj}."
        if marker in name:
            head, _, tail = name.partition(marker)
            return head + marker[:-1], tail
    return None


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


def _convert_4bit(prefix: str, parts: dict, quant: WeightQuant) -> tuple[torch.Tensor, ...]:
    state_key = next(k for k in parts if k.startswith(_STATE_KEY[1:]))
    info = _state_json(parts[state_key])
    n, k = info["shape"]
    if info["blocksize"] != quant.group_size or k % quant.group_size:
        raise ValueError(
            f"{prefix}: the checkpoint's 4-bit blocks hold {info['blocksize']} weights "
            f"(rows of {k}); set quant_block_size={info['blocksize']} (it must divide {k})"
        )
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


def convert_bnb_weights(
    weights: Iterable[tuple[str, torch.Tensor]], quant: WeightQuant
) -> Iterator[tuple[str, torch.Tensor]]:
    """Hugging Face-named tensors of a bitsandbytes checkpoint -> our names: each quantized
    projection yields `<proj>.qweight` and `<proj>.scales` (int8 scale = SCB / 127); other
    tensors (norms, embeddings, LM head, biases) pass through."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    done: set[str] = set()
    for name, tensor in weights:
        split = _split(name)
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
