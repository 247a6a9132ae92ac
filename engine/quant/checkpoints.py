"""Which quantized checkpoints are read, and how: a config.json quantization_config resolved to
a WeightQuant (checkpoint_quant), refused with a message that names what is not served and
what is; and the engine settings plus the checkpoint resolved to the WeightQuant a model loads
with (resolve_weight_quant). Torch-free at import (compressed-tensors' config reader is
imported when such a checkpoint is read).

Each method's tensors are converted at load by engine/quant/formats (bitsandbytes':
engine/quant/bnb.py).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Protocol

from engine.quant.weight_format import BNB_INSTALL, WeightQuant, check_int4_group

if TYPE_CHECKING:
    from engine.config import EngineConfig

CHECKPOINT_METHODS = ("bitsandbytes", "awq", "gptq", "compressed-tensors", "fp8")
"""quantization_config quant_method values whose linear weights are read as they are stored
(gpt-oss's "mxfp4" experts are dequantized by its model: engine/models/gpt_oss.py)."""
SERVED = (
    "bitsandbytes (load_in_8bit, load_in_4bit); AWQ (4-bit, GEMM packing); GPTQ (4 or 8 bits, "
    "symmetric or not, desc_act); compressed-tensors pack-quantized W4A16 / W8A16 (group or "
    "channel scales) and float-quantized FP8 (tensor, channel or block scales); FP8 "
    "(quant_method fp8, e4m3, per-tensor or block scales); MXFP4 (gpt-oss)"
)
"""What the refusals say we serve."""
CT_FORMATS = ("pack-quantized", "float-quantized")
"""compressed-tensors formats read."""


def refuse(what: str) -> ValueError:
    """The error for a checkpoint variant that is not served: names it, then what is."""
    return ValueError(f"checkpoint quantization {what} is not supported; supported: {SERVED}")


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
    to a format before the model loads: engine.startup.planned_config.plan_engine). A quantized
    checkpoint keeps its own format: a `quantization` that contradicts it is refused."""
    wanted = config.quantization
    quant = checkpoint_quant(model.quantization_config, config.quant_block_size)
    if quant is not None:
        if wanted not in ("none", "auto", quant.kind):
            raise ValueError(
                f"the checkpoint is already quantized ({quant.kind}, {quant.method}); "
                f"quantization={wanted!r} cannot re-quantize it: use 'auto' or {quant.kind!r}"
            )
        if quant.method != "bitsandbytes" and model.moe_intermediate_size:
            raise refuse(f"{quant.method!r} of a mixture-of-experts model")
    elif wanted == "fp8":
        raise ValueError(
            "quantization='fp8' reads an FP8 checkpoint's weights; this checkpoint is not "
            "FP8: use int8 or int4 to quantize it at load"
        )
    elif wanted in ("int8", "int4"):
        quant = WeightQuant(wanted, config.quant_block_size, embeddings=config.quantize_embeddings)
    elif config.quantize_embeddings:
        raise ValueError(
            "quantize_embeddings needs quantized weights: set quantization to int8 or int4"
        )
    else:
        return None
    widths = [model.hidden_size, model.intermediate_size, model.num_heads * model.head_dim]
    widths += [model.moe_intermediate_size] if model.moe_intermediate_size else []  # w_down
    if quant.kind == "int4" and not quant.method:  # the projections' inputs
        check_int4_group(quant.group_size, widths)
    elif quant.group_size and quant.kind != "fp8":
        bad = sorted({w for w in widths if w % quant.group_size})
        if bad:
            raise ValueError(
                f"the checkpoint's groups of {quant.group_size} weights do not divide the "
                f"layers' input sizes {bad}"
            )
    if quant.method in ("", "bitsandbytes") and importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(f"quantization {quant.kind} needs bitsandbytes: {BNB_INSTALL}")
    return quant


def checkpoint_quant(raw: dict | None, group_size: int) -> WeightQuant | None:
    """The WeightQuant a config.json quantization_config describes (None: not quantized);
    group_size: the engine's quant_block_size, which a bitsandbytes checkpoint's blocks must
    match. Raises (refuse) for a method or variant not served."""
    if not raw:
        return None
    method = raw.get("quant_method")
    readers = {
        "bitsandbytes": lambda: _bitsandbytes(raw, group_size),
        "awq": lambda: _awq(raw),
        "gptq": lambda: _gptq(raw),
        "compressed-tensors": lambda: _compressed_tensors(raw),
        "fp8": lambda: _fp8(raw),
    }
    if method == "mxfp4":
        raise refuse("'mxfp4' outside gpt-oss's experts")
    if method not in readers:
        raise refuse(repr(method))
    return readers[method]()


def _bitsandbytes(raw: dict, group_size: int) -> WeightQuant:
    if raw.get("load_in_8bit"):
        return WeightQuant("int8", group_size, method="bitsandbytes")
    if raw.get("load_in_4bit"):
        storage = raw.get("bnb_4bit_quant_storage", "uint8")
        if storage != "uint8":
            raise ValueError(f"bnb_4bit_quant_storage={storage!r} is not supported; use uint8")
        quant_type = raw.get("bnb_4bit_quant_type", "fp4")
        if quant_type not in ("nf4", "fp4"):
            raise ValueError(f"bnb_4bit_quant_type={quant_type!r} is not supported")
        return WeightQuant("int4", group_size, quant_type, method="bitsandbytes")
    raise ValueError("bitsandbytes quantization_config with neither load_in_8bit nor load_in_4bit")


def _group(value) -> int:
    """A config's group_size: -1 / None (one group per row) -> 0."""
    return 0 if value in (None, -1) else int(value)


def _awq(raw: dict) -> WeightQuant:
    version = str(raw.get("version", "gemm")).lower()
    if version != "gemm":
        raise refuse(f"AWQ version {version!r} (only 'gemm' packing is read)")
    if raw.get("bits", raw.get("w_bit", 4)) != 4:
        raise refuse(f"AWQ with {raw.get('bits', raw.get('w_bit'))} bits")
    if not raw.get("zero_point", True):
        raise refuse("AWQ without zero points")
    group = _group(raw.get("group_size", raw.get("q_group_size", 128)))
    return WeightQuant("int4", group, "uint", method="awq")


def _gptq(raw: dict) -> WeightQuant:
    bits = raw.get("bits", 4)
    if bits not in (4, 8):
        raise refuse(f"GPTQ with {bits} bits (4 and 8 are read)")
    layout = str(raw.get("checkpoint_format", "gptq")).lower()
    if layout not in ("gptq", "gptq_v2") or raw.get("is_marlin_format"):
        layout = "marlin" if raw.get("is_marlin_format") else layout
        raise refuse(f"GPTQ checkpoint_format {layout!r} (only 'gptq' and 'gptq_v2' are read)")
    kind = "int4" if bits == 4 else "int8"
    # zero points are always stored: symmetric ones at the midpoint (v1: the midpoint less one)
    variant = ("v2" if layout == "gptq_v2" else "v1") + ("-desc_act" if raw.get("desc_act") else "")
    quant_type = "int" if raw.get("sym", True) else "uint"
    return WeightQuant(kind, _group(raw.get("group_size")), quant_type, "gptq", variant=variant)


def _fp8(raw: dict) -> WeightQuant:
    fmt = str(raw.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise refuse(f"FP8 {fmt!r} (only e4m3 is read)")
    block = raw.get("weight_block_size")
    if block is None:  # one scale per tensor, kept per channel
        return WeightQuant("fp8", 0, "fp8", "fp8", variant="channel")
    rows, cols = (int(b) for b in block)
    return WeightQuant("fp8", cols, "fp8", "fp8", variant=f"block:{rows}x{cols}")


def _compressed_tensors(raw: dict) -> WeightQuant:
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError as e:
        raise ValueError(
            "compressed-tensors checkpoints need the compressed-tensors package: "
            "pip install compressed-tensors"
        ) from e
    if raw.get("sparsity_config"):
        sparsity = raw["sparsity_config"].get("format", "sparse")
        raise refuse(f"compressed-tensors sparsity {sparsity!r} (e.g. 2:4)")
    fields = {k: v for k, v in raw.items() if k in QuantizationConfig.model_fields}
    config = QuantizationConfig.model_validate(fields)
    if config.format not in CT_FORMATS:
        raise refuse(f"compressed-tensors format {config.format!r} (read: {', '.join(CT_FORMATS)})")
    if config.kv_cache_scheme is not None:
        raise refuse("compressed-tensors kv_cache_scheme (quantized KV-cache scales)")
    schemes = [s for s in config.config_groups.values() if s.weights is not None]
    if not schemes or any(s.weights != schemes[0].weights for s in schemes):
        raise refuse("compressed-tensors with several weight schemes (mixed precision)")
    w, act = schemes[0].weights, schemes[0].input_activations
    strategy = str(w.strategy)
    if w.actorder not in (None, False, "static", "weight"):  # a g_idx per weight
        raise refuse(f"compressed-tensors actorder {w.actorder!r} (weight_g_idx)")
    if config.format == "pack-quantized":
        if w.type != "int" or w.num_bits not in (4, 8) or strategy not in ("group", "channel"):
            raise refuse(
                f"compressed-tensors pack-quantized {w.type}{w.num_bits} by {strategy} "
                "(read: int4 / int8 by group or channel)"
            )
        if act is not None:
            raise refuse("compressed-tensors integer weights with quantized activations (W8A8)")
        group = w.group_size if strategy == "group" else 0
        quant_type = "int" if w.symmetric else "uint"
        kind = "int4" if w.num_bits == 4 else "int8"
        return WeightQuant(kind, group, quant_type, "compressed-tensors", variant=config.format)
    if w.type != "float" or w.num_bits != 8 or strategy not in ("tensor", "channel", "block"):
        raise refuse(f"compressed-tensors float-quantized {w.type}{w.num_bits} by {strategy}")
    if strategy == "block":
        rows, cols = w.block_structure
        return WeightQuant("fp8", cols, "fp8", "compressed-tensors", variant=f"block:{rows}x{cols}")
    return WeightQuant("fp8", 0, "fp8", "compressed-tensors", variant="channel")
