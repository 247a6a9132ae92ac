"""Resolving device, dtypes, max_model_len and the KV pool size from config + model + device.

A first, simple plan; the full GPU planner (probe, weights/activation/graph budgets,
verification after warm-up) builds on these numbers.
"""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.memory_cap import usable_mem_info
from engine.models.config import ModelConfig
from engine.quant.format import BNB_4BIT_BLOCKS, resolve_weight_quant  # noqa: F401 (re-exported)

CPU_MAX_MODEL_LEN = 8192
_NAMED = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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


def resolve_dtypes(
    config: EngineConfig, model: ModelConfig, device: torch.device
) -> tuple[torch.dtype, torch.dtype]:
    """(activation/weight dtype, KV-cache dtype)."""
    resolve_weight_quant(config, model)  # bad quantization settings fail before loading
    if config.dtype != "auto":
        dtype = _NAMED[config.dtype]
    elif device.type == "cpu":
        dtype = torch.float32
    elif torch.cuda.is_bf16_supported():
        dtype = torch.bfloat16
    else:
        dtype = torch.float16
    if config.kv_cache_dtype == "auto":
        return dtype, dtype
    if config.kv_cache_dtype == "int8":
        return dtype, torch.int8  # plus one fp16 scale per token and KV head (see torch_ref)
    return dtype, _NAMED[config.kv_cache_dtype]


def resolve_max_model_len(config: EngineConfig, model: ModelConfig, device: torch.device) -> int:
    limit = model.max_position_embeddings
    why = "the model's max_position_embeddings"
    if model.sliding_window is not None and model.sliding_window < limit:
        limit, why = model.sliding_window, "the model's sliding_window (not implemented)"
    if config.max_model_len is None:
        if device.type == "cpu":
            return min(limit, CPU_MAX_MODEL_LEN)
        return limit
    if config.max_model_len > limit:
        raise ValueError(
            f"max_model_len={config.max_model_len} exceeds {why} ({limit}); "
            f"set max_model_len <= {limit}"
        )
    return config.max_model_len


def kv_bytes_per_token(model: ModelConfig, kv_dtype: torch.dtype) -> int:
    """KV-cache bytes per token, int8 scales included (ModelConfig.kv_cache_bytes_per_token)."""
    return model.kv_cache_bytes_per_token(str(kv_dtype).removeprefix("torch."))


def plan_num_kv_blocks(
    config: EngineConfig, model: ModelConfig, device: torch.device, kv_dtype: torch.dtype
) -> int:
    """Enough blocks for max_num_seqs full-length sequences, capped by the memory budget."""
    block_bytes = kv_bytes_per_token(model, kv_dtype) * config.block_size
    wanted = config.max_num_seqs * (-(-config.max_model_len // config.block_size))
    if device.type == "cuda":
        free, total = usable_mem_info(device)  # honours APPLIANCE_MEMORY_CAP_GIB
        used = total - free
        activation_reserve = 2 * 1024**3
        budget = int(total * config.gpu_memory_utilization) - used - activation_reserve
    else:
        budget = int(config.cpu_kv_cache_gib * 1024**3)
    return max(1, min(wanted, budget // block_bytes))
