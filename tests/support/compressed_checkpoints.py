"""Quantized checkpoints written by the compressed-tensors library itself: a tiny model's
linear layers quantized by one scheme (scales from each weight's own min/max, the
library's calculate_qparams), compressed by its ModelCompressor, saved with the config.json
quantization_config it writes."""

from __future__ import annotations

from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils import calculate_qparams
from transformers import AutoModelForCausalLM

from tests.support.tiny_models import byte_tokenizer

FP8 = {"num_bits": 8, "type": "float", "symmetric": True}
TOKEN_FP8 = QuantizationArgs(**FP8, strategy="token", dynamic=True)

SCHEMES = {  # name -> (weights, input activations): the schemes the tests write
    "w4a16-asym-group": (QuantizationArgs(num_bits=4, symmetric=False, strategy="group",
                                          group_size=32), None),
    "w4a16-sym-channel": (QuantizationArgs(num_bits=4, strategy="channel"), None),
    "w8a16-sym-channel": (QuantizationArgs(num_bits=8, strategy="channel"), None),
    "w8a16-asym-group": (QuantizationArgs(num_bits=8, symmetric=False, strategy="group",
                                          group_size=32), None),
    "fp8-channel": (QuantizationArgs(**FP8, strategy="channel"), TOKEN_FP8),
    "fp8-block": (QuantizationArgs(**FP8, strategy="block", block_structure=[128, 128]),
                  TOKEN_FP8),
}  # fmt: skip


def _min_max(w: torch.Tensor, args: QuantizationArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """Each scale's range of weights: per group, row (channel), tensor or block."""
    n, k = w.shape
    strategy = str(args.strategy)
    if strategy == "group":
        v = w.view(n, k // args.group_size, args.group_size)
        return v.amin(-1), v.amax(-1)
    if strategy == "channel":
        return w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    if strategy == "block":
        r, c = args.block_structure
        v = w.view(n // r, r, k // c, c)
        return v.amin((1, 3)), v.amax((1, 3))
    return w.amin().reshape(1), w.amax().reshape(1)


def save_compressed(
    source: Path, folder: Path, weights: QuantizationArgs, activations: QuantizationArgs | None
) -> Path:
    """The model in `source` with every Linear but the LM head quantized by `weights` (and
    `activations`, dynamic), saved compressed in `folder` with its tokenizer."""
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=activations)
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    apply_quantization_config(model, config)
    with torch.no_grad():
        for module in model.modules():
            if getattr(module, "quantization_scheme", None) is None:
                continue
            low, high = _min_max(module.weight.float(), weights)
            scale, zero = calculate_qparams(low, high, weights)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(str(folder))
    byte_tokenizer().save_pretrained(folder)
    return Path(folder)
