"""Quantized checkpoints converted at load, one projection at a time, into our weight layout
(engine/quant/weight_format.py): the stream of Hugging Face-named tensors in, the stream with
each quantized projection's parts replaced by `<proj>.qweight`, `.scales` and, where the
format has them, `.zeros` and `.perm` out (the model's loader fuses them like any weight).

- int_packing.py: integers packed in int32 words, unpacked; our int4 bytes packed.
- awq.py: AWQ's GEMM packing (4-bit, zero points).
- gptq.py: GPTQ (4 or 8 bits, symmetric or not, desc_act's g_idx, v1's zero points less one).
- compressed.py: compressed-tensors pack-quantized (int4 / int8, group or channel scales).
- float8_weights.py: FP8 e4m3 with tensor, channel or block scales (compressed-tensors
  float-quantized and quant_method fp8).
bitsandbytes' checkpoints: engine/quant/bnb.py. Which checkpoint is which:
engine/quant/checkpoints.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from engine.quant.weight_format import WeightQuant, split_projection

Convert = Callable[[str, dict[str, torch.Tensor], WeightQuant], dict[str, torch.Tensor]]
"""convert(projection name, its checkpoint parts, quant) -> our parts (qweight, scales, ...)."""


def convert_checkpoint(
    weights: Iterable[tuple[str, torch.Tensor]], quant: WeightQuant
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each quantized projection converted (quant.method says
    whose); other tensors (norms, embeddings, LM head, biases) pass through."""
    if quant.method == "bitsandbytes":
        from engine.quant.bnb import convert_bnb_weights

        yield from convert_bnb_weights(weights, quant)
        return
    needed, late, convert = _method(quant)
    yield from convert_projections(weights, quant, needed, late, convert)


def _method(quant: WeightQuant) -> tuple[tuple[set[str], ...], set[str], Convert]:
    """(the part sets a projection may complete with, parts that may come after and are
    dropped, the converter) of quant.method."""
    if quant.method == "awq":
        from engine.quant.formats.awq import convert_awq

        return ({"qweight", "qzeros", "scales"},), set(), convert_awq
    if quant.method == "gptq":
        from engine.quant.formats.gptq import LATE_PARTS, convert_gptq, needed_parts

        return (needed_parts(quant),), LATE_PARTS, convert_gptq
    if quant.kind == "fp8":
        from engine.quant.formats.float8_weights import SCALE_NAMES, convert_fp8

        return tuple({"weight", s} for s in SCALE_NAMES), {"input_scale"}, convert_fp8
    from engine.quant.formats.compressed import convert_packed, needed_parts

    return (needed_parts(quant),), set(), convert_packed


def convert_projections(
    weights: Iterable[tuple[str, torch.Tensor]],
    quant: WeightQuant,
    needed: tuple[set[str], ...],
    late: set[str],
    convert: Convert,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Collect each projection's parts until one of the `needed` sets is all there, then yield
    convert's parts under the projection's name; parts in `late` arriving after that are
    dropped. Raises naming a projection whose parts never complete, or a part never read."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    done: set[str] = set()
    for name, tensor in weights:
        split = split_projection(name)
        if split is None or split[1] == "bias":
            yield name, tensor
            continue
        prefix, part = split
        if prefix in done:
            if part not in late:
                raise ValueError(f"checkpoint tensor {name!r} is not read ({quant.method})")
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if any(n <= parts.keys() for n in needed):
            done.add(prefix)
            for ours, value in convert(prefix, pending.pop(prefix), quant).items():
                yield f"{prefix}.{ours}", value
    if pending:
        prefix, parts = next(iter(pending.items()))
        if set(parts) == {"weight"}:
            raise ValueError(
                f"{prefix} is not quantized in this {quant.method} checkpoint; checkpoints "
                "that keep some projections in 16 bits are not read"
            )
        raise ValueError(
            f"checkpoint is missing parts of quantized weight {prefix!r} "
            f"(has {sorted(parts)}, needs {sorted(needed[0])})"
        )
