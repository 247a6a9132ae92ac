"""The vision encoder's share of the memory plan: its weights and the activation peak of one
step's encoder call, for a multimodal checkpoint (ModelConfig.vision); 0 for a text model.
Torch-free, from config.json (engine.models.vision_params)."""

from __future__ import annotations

from engine.models.model_config import ModelConfig
from engine.models.vision_params import max_image_patches, vision_params, vision_shape
from engine.planner.formulas import WeightLayout

HIDDEN_TENSORS = 8
"""Hidden-wide tensors a patch holds at an encoder layer's peak: the residual stream, the
normed input, q, k and v, the attention output, and fp32 temporaries (the norms', Qwen3.5's
rotary) worth two more. The MLP's intermediate-wide outputs come on top (VisionShape.mlp_outputs):
a sum of both sub-layers' peaks, never below either."""
PIXEL_BYTES = 4
"""The processor's pixel values are float32."""


def vision_weight_bytes(
    m: ModelConfig, fmt: str, dtype_bytes: int, group_size: int, layout: WeightLayout | None
) -> int:
    """The encoder's weights, all in the activation dtype: the engine quantizes the text model
    only (engine/quant/modules.py quantize_model leaves `vision.` alone, as AWQ, GPTQ and FP8
    checkpoints leave their vision towers in 16 bits). `fmt`, `group_size` and `layout` are
    the text model's, taken for the day the encoder is quantized too."""
    if not m.vision:
        return 0
    return vision_params(m.vision).total * dtype_bytes


def vision_activation_bytes(
    m: ModelConfig,
    dtype_bytes: int,
    max_encoder_tokens: int,
    max_image_pixels: int,
    max_images_per_request: int,
    fused_attention: bool = True,
) -> int:
    """The encoder's peak in one step, plus the rows one request's images keep.

    A step sends its images to the encoder in one call, up to max_encoder_tokens placeholder
    rows (the scheduler's encoder budget; a step's first image always goes, so one image of
    the largest kind, max_image_patches, even past the budget). Each row stands for
    patches_per_row patches whatever the image's size, so the step's patches are at most
    patches_per_row x max(max_encoder_tokens, the largest image's rows). An encoder that runs
    its images one at a time (Qwen3.5) holds one largest image's patches instead.

    Per patch: HIDDEN_TENSORS x hidden + mlp_outputs x intermediate elements in the activation
    dtype, plus its float32 pixel values and their cast. The encoders attend with SDPA, whose
    fused kernels (flash or memory-efficient on a GPU, fp32 included; flash on the CPU) keep
    no scores for these shapes (no mask, head_dim a multiple of 8), so none are counted; with
    fused_attention=False (a math-path fallback) patches^2 x heads x 4 B per image attended at
    once are (Gemma 3: the step's images together).

    The encoder cache keeps every live image's rows until its request finishes:
    max_images_per_request x the largest image's rows x the text width are counted (one
    request's worth; each image's rows take far less than its placeholders' KV)."""
    if not m.vision:
        return 0
    shape = vision_shape(m.vision)
    patches = max_image_patches(m.vision, max_image_pixels)
    rows = max(1, patches // shape.patches_per_row)
    step_rows = max(max_encoder_tokens, rows)
    step_patches = step_rows * shape.patches_per_row if shape.images_together else patches
    per_patch = HIDDEN_TENSORS * shape.hidden_size + shape.mlp_outputs * shape.intermediate_size
    forward = step_patches * (
        per_patch * dtype_bytes + shape.patch_dim * (PIXEL_BYTES + dtype_bytes)
    )
    if not fused_attention:
        images = max(1, step_rows // rows) if shape.scores_together else 1
        forward += images * patches * patches * shape.num_heads * 4
    cached = max_images_per_request * rows * shape.text_hidden_size * dtype_bytes
    return forward + cached
