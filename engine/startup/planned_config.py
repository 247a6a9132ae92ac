"""The engine's side of the memory plan: the torch device, the caller's pins, the checkpoint's
own weight format, and the plan (engine.planner) turned into a complete EngineConfig and the
torch dtypes it names; prefix caching turned off for models it cannot serve exactly."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from engine.config import EngineConfig
from engine.models.linear_attention import RECURRENT_STATE_BYTES
from engine.models.model_config import ModelConfig
from engine.planner import Device, Plan, PlanRequest, plan, read_device
from engine.planner.formulas import ELEMENT_BYTES, FORMAT_BITS, WeightLayout
from engine.quant.checkpoints import resolve_weight_quant
from engine.quant.weight_format import WeightQuant
from engine.spec.draft_model import draft_model_config

logger = logging.getLogger(__name__)

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
    return the plan with the complete config. A quantized checkpoint pins its own format (and
    its layout: bits, scale groups, zero points). device_kind: "cuda" or "cpu"; device_info:
    the Device to plan for (default: read here, as `appliance serve` and `appliance profile`
    read it); targets: PlanRequest targets (target_num_seqs, ..., draft_model: the draft's
    ModelConfig where the caller read it already). A draft model (speculative="draft:PATH") is
    counted: its weights, and its K/V in every block. Raises PlanError (a ValueError naming the
    one setting to change) when the pins cannot fit."""
    quant = resolve_weight_quant(pins, model)  # bad quantization settings fail before planning
    if quant is not None and quant.prequantized:
        pins = replace(pins, quantization=quant.kind)
        if quant.method != "bitsandbytes":  # its blocks are quant_block_size's
            targets["checkpoint_layout"] = checkpoint_layout(quant)
    if "draft_model" not in targets:  # speculative="draft:PATH": counted in the plan
        draft = draft_model_config(pins, model)
        targets["draft_model"] = None if draft is None else draft[1]
    info = device_info or read_device(device_kind)
    result = plan(model, info, PlanRequest.from_config(pins, **targets))
    return result, replace(pins, **result.engine_kwargs())


def checkpoint_layout(quant: WeightQuant) -> WeightLayout:
    """How a quantized checkpoint's weights are held once read, for the planner's bytes."""
    zeros = ", zero points" if quant.zero_points else ""
    groups = f"groups of {quant.group_size}" if quant.group_size else "per row"
    name = f"{quant.kind} ({quant.method}, {groups}{zeros})"
    return WeightLayout(FORMAT_BITS[quant.kind], quant.group_size, quant.zero_points, name)


def prefix_caching_for(model: ModelConfig, config: EngineConfig) -> EngineConfig:
    """`config` with prefix caching off, said in one log line, for a model with
    linear-attention layers (Qwen3.5): a cached prefix would skip the prefill that builds each
    sequence's recurrent state, and caching that state at block boundaries would cost a copy of
    the whole state (every linear layer's) per block of every prompt (docs/design.md, "Prefix
    caching and hybrid models"). Other models keep the setting as it is."""
    if not config.prefix_caching or not model.linear_layer_ids():
        return config
    logger.info(
        "prefix caching off: the model's %d linear-attention layers keep a recurrent state per "
        "sequence that a cached prefix would skip building (caching it at block boundaries "
        "would copy %d bytes of state per block)",
        len(model.linear_layer_ids()),
        model.state_bytes_per_sequence(RECURRENT_STATE_BYTES, ELEMENT_BYTES[config.dtype]),
    )
    return replace(config, prefix_caching=False)
