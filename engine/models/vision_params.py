"""The vision encoders' sizes from a checkpoint's config.json alone, torch-free (the planner
reads configs without torch): their parameters by kind (VisionParams) and the shape their
activations take (VisionShape), for SigLIP + Gemma 3's projector, Gemma 4's vision tower +
embedder and Qwen3.5's vision tower + merger (engine/models/vision/).

The defaults below are the ones the encoder modules fill in for keys a config.json leaves out
(tests/test_vision_params.py checks they agree)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.gemma4_config import text_config as gemma4_text_config

SIGLIP_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
}
"""engine.models.vision.siglip.SiglipConfig's defaults, under config.json's names."""
GEMMA4_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
    "pooling_kernel_size": 3,
    "patch_size": 16,
    "position_embedding_size": 10 * 1024,
    "use_clipped_linears": False,
    "standardize": False,
}
"""transformers 5.25's Gemma4VisionConfig defaults, for the fields config.json leaves out (the
encoder, engine/models/vision/gemma4_vision.py, reads them from here)."""
GEMMA4_MAX_SOFT_TOKENS = 280
"""Soft tokens of Gemma 4's largest image: transformers' image processor resizes every image
to at most max_soft_tokens x pooling_kernel_size**2 patches, max_soft_tokens 280 by default (a
preprocessor_config.json may choose 70 to 1120; config.json does not say)."""
QWEN3_5_DEFAULTS = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
    "hidden_act": "gelu_pytorch_tanh",
}
"""transformers' Qwen3_5VisionConfig defaults: a config.json may leave fields to them (the
encoder, engine/models/vision/qwen3_5_vision_layers.py, reads them from here)."""


@dataclass(frozen=True)
class VisionParams:
    """A vision encoder's checkpoint tensors by kind (ParamCounts' kinds)."""

    linear: int
    """Weights of the projections the engine quantizes with the text model's (the names in
    engine.quant.modules.QUANTIZED_LINEARS: SigLIP's attention out_proj; none in Gemma 4's or
    Qwen3.5's encoder)."""
    linear_rows: int
    """Output rows of those projections."""
    other: int
    """Everything else, kept in the activation dtype: the other projections, embeddings,
    norms, biases (and Gemma 4's clip bounds and standardization buffers)."""

    @property
    def total(self) -> int:
        return self.linear + self.other


@dataclass(frozen=True)
class VisionShape:
    """What an encoder's activations scale with."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    mlp_outputs: int
    """Intermediate-wide tensors the MLP holds at once (2: fc1 and its activation; 3 for a
    gated MLP: activation, up and their product)."""
    patch_dim: int
    """Pixel values per patch (fp32 as the processor gives them)."""
    patches_per_row: int
    """Patches behind one placeholder row (the pooling or merge factor)."""
    text_hidden_size: int
    """Width of the rows the encoder hands the text model."""
    images_together: bool
    """Whether one encoder call runs a step's images through its layers together (Gemma 3,
    Gemma 4) or one image at a time (Qwen3.5)."""
    scores_together: bool
    """Whether attention runs on the step's images in one call (Gemma 3's same-size batch)
    rather than one image at a time."""


def vision_params(config: dict) -> VisionParams:
    """The encoder's parameters (and persistent buffers) for a multimodal config.json."""
    kind = config.get("model_type")
    if kind == "gemma3":
        return _gemma3_params(config)
    if kind == "gemma4":
        return _gemma4_params(config)
    if kind in ("qwen3_5", "qwen3_5_moe"):
        return _qwen3_5_params(config)
    raise ValueError(f"no vision encoder for model_type {kind!r}")


def vision_shape(config: dict) -> VisionShape:
    """The encoder's activation shape for a multimodal config.json."""
    kind = config.get("model_type")
    if kind == "gemma3":
        v, _ = _vision(config, SIGLIP_DEFAULTS)
        grid = v["image_size"] // v["patch_size"]
        rows = config.get("mm_tokens_per_image", 256)
        return VisionShape(
            v["hidden_size"],
            v["intermediate_size"],
            v["num_attention_heads"],
            2,
            v["num_channels"] * v["patch_size"] ** 2,
            grid * grid // rows,
            (config.get("text_config") or {}).get("hidden_size", 2304),
            images_together=True,
            scores_together=True,
        )
    if kind == "gemma4":
        v, _ = _vision(config, GEMMA4_DEFAULTS)
        return VisionShape(
            v["hidden_size"],
            v["intermediate_size"],
            v["num_attention_heads"],
            3,
            3 * v["patch_size"] ** 2,
            v["pooling_kernel_size"] ** 2,
            gemma4_text_config(config)["hidden_size"],
            images_together=True,
            scores_together=False,
        )
    if kind in ("qwen3_5", "qwen3_5_moe"):
        v, _ = _vision(config, QWEN3_5_DEFAULTS)
        return VisionShape(
            v["hidden_size"],
            v["intermediate_size"],
            v["num_heads"],
            2,
            v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2,
            v["spatial_merge_size"] ** 2,
            v["out_hidden_size"],
            images_together=False,
            scores_together=False,
        )
    raise ValueError(f"no vision encoder for model_type {kind!r}")


def max_image_patches(config: dict, max_image_pixels: int) -> int:
    """Patches of the largest image the encoder takes when the server accepts images of up to
    max_image_pixels: Gemma 3 resizes every image (or crop) to image_size^2; Gemma 4 to at
    most GEMMA4_MAX_SOFT_TOKENS x pooling_kernel_size^2 patches; Qwen3.5 keeps the image's
    pixels (one patch each patch_size^2, whole merge blocks)."""
    kind = config.get("model_type")
    if kind == "gemma3":
        v, _ = _vision(config, SIGLIP_DEFAULTS)
        return (v["image_size"] // v["patch_size"]) ** 2
    if kind == "gemma4":
        v, _ = _vision(config, GEMMA4_DEFAULTS)
        return GEMMA4_MAX_SOFT_TOKENS * v["pooling_kernel_size"] ** 2
    if kind in ("qwen3_5", "qwen3_5_moe"):
        v, _ = _vision(config, QWEN3_5_DEFAULTS)
        block = v["spatial_merge_size"] ** 2
        return max(block, max_image_pixels // v["patch_size"] ** 2 // block * block)
    raise ValueError(f"no vision encoder for model_type {kind!r}")


def _vision(config: dict, defaults: dict) -> tuple[dict, dict]:
    """(vision_config with the defaults filled in, the raw text_config)."""
    raw = {k: v for k, v in (config.get("vision_config") or {}).items() if v is not None}
    return {**defaults, **raw}, config.get("text_config") or {}


def _gemma3_params(config: dict) -> VisionParams:
    """SigLIP (patch conv, position table, pre-LN layers with biased q/k/v/out and fc1/fc2, a
    final LayerNorm) and the projector (a Gemma RMSNorm and a bias-free projection)."""
    v, text = _vision(config, SIGLIP_DEFAULTS)
    h, i, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    num_patches = (v["image_size"] // p) ** 2
    embed = h * v["num_channels"] * p * p + h + num_patches * h
    attn = 3 * (h * h + h) + h  # q, k, v with biases; out_proj's bias (its weight: linear)
    layer_other = 4 * h + attn + (h * i + i) + (i * h + h)  # two LayerNorms, the MLP
    layers = v["num_hidden_layers"]
    projector = h + h * text.get("hidden_size", 2304)
    other = embed + layers * layer_other + 2 * h + projector
    return VisionParams(layers * h * h, layers * h, other)


def _gemma4_params(config: dict) -> VisionParams:
    """The patch embedder (a bias-free projection and two position tables), layers of
    bias-free q/k/v/o and gated MLP with q/k norms and four RMS norms (clip bounds: four
    scalars per projection), standardization buffers, and the embedder's projection."""
    v, _ = _vision(config, GEMMA4_DEFAULTS)
    h, i, d = v["hidden_size"], v["intermediate_size"], v["head_dim"]
    q, kv = v["num_attention_heads"] * d, v["num_key_value_heads"] * d
    embed = 3 * v["patch_size"] ** 2 * h + 2 * v["position_embedding_size"] * h
    layer = h * (q + 2 * kv) + q * h + 2 * d + 3 * h * i + 4 * h
    layer += 4 * 7 if v["use_clipped_linears"] else 0
    tower = embed + v["num_hidden_layers"] * layer + (2 * h if v["standardize"] else 0)
    return VisionParams(0, 0, tower + h * gemma4_text_config(config)["hidden_size"])


def _qwen3_5_params(config: dict) -> VisionParams:
    """The patch projection (with bias), the position table, ViT blocks (two LayerNorms,
    fused qkv and proj with biases, fc1/fc2 with biases) and the merger (a LayerNorm, then two
    biased projections from m^2 patches' width)."""
    v, _ = _vision(config, QWEN3_5_DEFAULTS)
    h, i = v["hidden_size"], v["intermediate_size"]
    patch_dim = v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2
    embed = patch_dim * h + h + v["num_position_embeddings"] * h
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
    merged, out = h * v["spatial_merge_size"] ** 2, v["out_hidden_size"]
    merger = 2 * h + merged * merged + merged + merged * out + out
    return VisionParams(0, 0, embed + v["depth"] * block + merger)
