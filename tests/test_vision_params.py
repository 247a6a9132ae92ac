"""The torch-free vision parameter counts (engine/models/vision_params.py) against the encoder
modules themselves, built on the meta device from tiny and real-size config dicts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.models import vision_params as vp
from engine.models.vision import build_vision
from engine.models.vision.gemma4_vision import VISION_DEFAULTS
from engine.models.vision.qwen3_5_vision_layers import DEFAULTS as QWEN_DEFAULTS
from engine.models.vision.siglip import SiglipConfig
from engine.quant.modules import QUANTIZED_LINEARS

SO400M = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "patch_size": 14,
    "image_size": 896,
}
"""Gemma 3 12B's SigLIP tower."""

CONFIGS = {
    "gemma3 tiny": {
        "model_type": "gemma3",
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "patch_size": 4,
            "image_size": 32,
        },
        "text_config": {"hidden_size": 64},
        "mm_tokens_per_image": 16,
    },
    "gemma3 12b": {
        "model_type": "gemma3",
        "vision_config": {**SO400M, "vision_use_head": False},
        "text_config": {"hidden_size": 3840},
        "mm_tokens_per_image": 256,
    },
    "gemma3 defaults": {
        "model_type": "gemma3",
        "vision_config": {"model_type": "siglip"},
        "mm_tokens_per_image": 49,
    },
    "gemma4 tiny clipped": {
        "model_type": "gemma4",
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "patch_size": 2,
            "position_embedding_size": 64,
            "use_clipped_linears": True,
            "standardize": True,
        },
        "text_config": {"hidden_size": 64},
    },
    "gemma4 defaults": {
        "model_type": "gemma4",
        "vision_config": {"pooling_kernel_size": 3},
        "text_config": {"hidden_size": 2560},
    },
    "qwen3_5 tiny": {
        "model_type": "qwen3_5",
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 4,
            "out_hidden_size": 48,
            "num_position_embeddings": 16,
        },
    },
    "qwen3_5 defaults": {"model_type": "qwen3_5_moe", "vision_config": {}},
}


def meta_encoder(config: dict) -> nn.Module:
    with torch.device("meta"):
        return build_vision(config)


@pytest.mark.parametrize("name", CONFIGS)
def test_counts_match_the_module(name):
    config = CONFIGS[name]
    module = meta_encoder(config)
    counts = vp.vision_params(config)
    # the checkpoint's tensors: parameters and persistent buffers (clip bounds, standardization)
    assert counts.total == sum(t.numel() for t in module.state_dict().values())
    quantized = [
        m
        for n, m in module.named_modules()
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in QUANTIZED_LINEARS
    ]
    assert counts.linear == sum(m.weight.numel() for m in quantized)
    assert counts.linear_rows == sum(m.out_features for m in quantized)


def test_so400m_size():
    """Gemma 3 12B's tower and projector: about 0.42 B parameters, 27 quantized out_proj."""
    counts = vp.vision_params(CONFIGS["gemma3 12b"])
    assert 0.41e9 < counts.total < 0.44e9
    assert counts.linear == 27 * 1152 * 1152


def test_defaults_agree_with_the_encoders():
    siglip = SiglipConfig()
    assert vp.SIGLIP_DEFAULTS == {
        "hidden_size": siglip.hidden_size,
        "intermediate_size": siglip.intermediate_size,
        "num_hidden_layers": siglip.num_layers,
        "num_attention_heads": siglip.num_heads,
        "num_channels": siglip.num_channels,
        "image_size": siglip.image_size,
        "patch_size": siglip.patch_size,
    }
    assert vp.GEMMA4_DEFAULTS == {k: VISION_DEFAULTS[k] for k in vp.GEMMA4_DEFAULTS}
    assert vp.QWEN3_5_DEFAULTS == {k: QWEN_DEFAULTS[k] for k in vp.QWEN3_5_DEFAULTS}


def test_shapes_and_largest_images():
    g3, g4, qw = CONFIGS["gemma3 12b"], CONFIGS["gemma4 defaults"], CONFIGS["qwen3_5 defaults"]
    assert vp.max_image_patches(g3, 10) == 64 * 64  # every image is resized to 896 x 896
    assert vp.vision_shape(g3).patches_per_row == 16  # 4096 patches pooled to 256 rows
    assert vp.max_image_patches(g4, 10**9) == 280 * 9
    assert vp.max_image_patches(qw, 1024 * 1024) == 4096  # 16 x 16 pixels a patch
    assert vp.max_image_patches(qw, 1000 * 1000) == 3904  # whole 2 x 2 merge blocks
    assert vp.vision_shape(qw).patches_per_row == 4
    assert vp.vision_shape(qw).patch_dim == 3 * 2 * 16 * 16
    with pytest.raises(ValueError, match="llama"):
        vp.vision_params({"model_type": "llama"})
