"""The engine's side of the memory plan: the torch device, the caller's pins, the checkpoint's
own weight format, and the plan (engine.planner) turned into a complete EngineConfig and the
torch dtypes it names."""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.config import EngineConfig
from engine.models.config import ModelConfig
from engine.models.quant import WeightQuant
from engine.planner import Device, Plan, PlanRequest, plan, read_device

TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,  # KV cache: plus one fp16 scale per token and KV head (see torch_ref)
}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device='cuda' was asked for, but no CUDA GPU is visible; use device='cpu' or 'auto'"
        )
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}; use 'auto', 'cuda' or 'cpu'")
    return dev


def plan_engine(
    pins: EngineConfig,
    model: ModelConfig,
    device_kind: str,
    device_info: Device | None = None,
    **targets,
) -> tuple[Plan, EngineConfig]:
    """Plan every setting `pins` leaves open (None / "auto") for this model on this device, and
    return the plan with the complete config. A bitsandbytes-quantized checkpoint pins its own
    format. device_kind: "cuda" or "cpu"; device_info: the Device to plan for (default: read
    here, as `appliance serve` and `appliance profile` read it); targets: PlanRequest targets
    (target_num_seqs, ...). Raises PlanError (a ValueError naming the one setting to change)
    when the pins cannot fit."""
    quant = resolve_weight_quant(pins, model)  # bad quantization settings fail before planning
    if quant is not None and quant.prequantized:
        pins = replace(pins, quantization=quant.kind)
    info = device_info or read_device(device_kind)
    result = plan(model, info, PlanRequest.from_config(pins, **targets))
    return result, replace(pins, **result.engine_kwargs())


BNB_4BIT_BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
"""Block sizes bitsandbytes' 4-bit quantizer accepts."""


def resolve_weight_quant(config: EngineConfig, model: ModelConfig) -> WeightQuant | None:
    """How linear weights are stored: None = 16-bit. `auto` stays 16-bit in the engine (the
    appliance planner turns it into int8/int4 when memory demands it)."""
    from engine.models.bnb_checkpoint import checkpoint_quant

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
    if quant.kind == "int4" and quant.group_size not in BNB_4BIT_BLOCKS:
        raise ValueError(
            f"quant_block_size={quant.group_size}: bitsandbytes quantizes 4-bit weights in "
            f"blocks of {', '.join(map(str, BNB_4BIT_BLOCKS))}; pick one of those (64 is usual)"
        )
    if quant.kind == "int4":
        sizes = {model.hidden_size, model.intermediate_size, model.num_heads * model.head_dim}
        bad = sorted(s for s in sizes if s % quant.group_size)
        if bad:
            raise ValueError(
                f"quant_block_size={quant.group_size} must divide the layers' input sizes "
                f"{sorted(sizes)} (not {bad}); pick a divisor such as 32 or 64"
            )
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(
            f"quantization {quant.kind} needs bitsandbytes: pip install bitsandbytes==0.50.2"
        )
    return quant
