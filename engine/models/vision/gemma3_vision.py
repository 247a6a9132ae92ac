"""Gemma 3's image encoder: the SigLIP tower (engine/models/vision/siglip.py) and Gemma 3's
multimodal projector, turning each image (or pan-and-scan crop) into the mm_tokens_per_image
rows that replace its placeholders in the text model.

The projector average-pools the tower's patch grid down to a tokens_per_side square, normalises
each row with Gemma's RMSNorm (x * (1 + w), in fp32 as transformers' Gemma3RMSNorm computes it)
and projects it to the text model's width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import Linear
from engine.models.vision.siglip import SiglipConfig, SiglipVisionTower, tower_param_name
from engine.models.weights import check_shape, missing_error
from engine.multimodal import ImageInput

TOWER_PREFIXES = ("model.vision_tower.", "vision_tower.")
PROJECTOR_PREFIXES = ("model.multi_modal_projector.", "multi_modal_projector.")
PREFIXES = TOWER_PREFIXES + PROJECTOR_PREFIXES
"""Checkpoint prefixes of the weights this encoder owns: a checkpoint saved by transformers 5
(under `model.`), one saved by transformers 4 or re-saved by transformers 5.25 (top level)."""

PROJECTION_WEIGHT = "mm_input_projection_weight"
"""The projector's [vision hidden, text hidden] matrix: loaded transposed into a Linear."""


class GemmaRMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * (1 + w), computed in fp32 and rounded once to x's dtype;
    w is the checkpoint's weight as stored."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Projector(nn.Module):
    """The tower's [num_images, num_patches, vision hidden] to
    [num_images, mm_tokens_per_image, text hidden]."""

    def __init__(self, vision: SiglipConfig, text_hidden_size: int, mm_tokens_per_image: int):
        super().__init__()
        side = math.isqrt(mm_tokens_per_image)
        if side * side != mm_tokens_per_image or vision.patches_per_side % side:
            raise ValueError(
                f"mm_tokens_per_image {mm_tokens_per_image} is not a square whose side divides "
                f"the {vision.patches_per_side}-patch grid"
            )
        self.patches_per_side = vision.patches_per_side
        self.kernel = vision.patches_per_side // side
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, vision.layer_norm_eps)
        self.mm_input_projection = Linear(vision.hidden_size, text_hidden_size, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # patches: [n, num_patches, d] -> grid [n, d, g, g] -> pooled [n, d, side, side]
        n, _, d = patches.shape
        g = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(n, d, g, g)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel)
        rows = pooled.flatten(2).transpose(1, 2).reshape(-1, d)  # [n * tokens, d], row-major
        out = self.mm_input_projection(self.mm_soft_emb_norm(rows))  # [n * tokens, text hidden]
        return out.view(n, -1, out.shape[-1])


class Gemma3Vision(nn.Module):
    """Gemma 3's vision encoder, built from the checkpoint's whole config.json dict."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        vision = SiglipConfig.from_dict(config.get("vision_config") or {})
        text_hidden = (config.get("text_config") or {}).get("hidden_size", 2304)
        self.mm_tokens_per_image: int = config.get("mm_tokens_per_image", 256)
        """Rows per image (or crop): its run of placeholder tokens."""
        self.vision_tower = SiglipVisionTower(vision)
        self.multi_modal_projector = Gemma3Projector(vision, text_hidden, self.mm_tokens_per_image)

    def forward(self, images: list[ImageInput]) -> list[torch.Tensor]:
        """Each image's [mm_tokens_per_image, text hidden] rows, in the module's dtype and on its
        device. Each image's data["pixel_values"] is one image, [1, 3, S, S] (a pan-and-scan
        crop arrives as an image of its own); images of one size go through the tower in one
        batch."""
        weight = self.vision_tower.embeddings.position_embedding.weight
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, image in enumerate(images):
            pixels = image.data["pixel_values"]
            if pixels.dim() != 4 or pixels.shape[0] != 1:
                raise ValueError(
                    f"Gemma 3 takes pixel_values [1, 3, S, S] per image; got {list(pixels.shape)}"
                )
            if image.length != self.mm_tokens_per_image:
                raise ValueError(
                    f"a Gemma 3 image fills {self.mm_tokens_per_image} placeholders; "
                    f"this one has {image.length}"
                )
            by_shape.setdefault(tuple(pixels.shape), []).append(i)
        outputs: list[torch.Tensor] = [None] * len(images)  # type: ignore[list-item]
        for indices in by_shape.values():
            pixels = torch.cat([images[i].data["pixel_values"] for i in indices])
            pixels = pixels.to(device=weight.device, dtype=weight.dtype)  # [n, 3, S, S]
            rows = self.multi_modal_projector(self.vision_tower(pixels))  # [n, tokens, text]
            for i, r in zip(indices, rows, strict=True):
                outputs[i] = r
        return outputs

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    ) -> None:
        """Copy the checkpoint's vision tower and projector tensors (names with one of PREFIXES)
        into our parameters; `copy(dst, src)` does each copy. Raises on a name that is not one
        of ours (a text weight included: pass only names with PREFIXES), on a shape that
        differs, and, at the end, on a parameter left unfilled."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            target = param_name(name)
            if target is not None and target.startswith(UNUSED):
                continue
            if target not in params:
                raise ValueError(f"unexpected weight {name!r} in a Gemma 3 vision checkpoint")
            if target in loaded:
                raise ValueError(f"weight {name!r} fills {target!r} a second time")
            if target.endswith("mm_input_projection.weight"):
                tensor = tensor.t()  # stored [in, out], a Linear holds [out, in]
            check_shape(name, tensor, params[target])
            copy(params[target], tensor)
            loaded.add(target)
        missing = sorted(set(params) - loaded)
        if missing:
            raise missing_error("Gemma 3 vision checkpoint", missing)

    def init_buffers(self, device: torch.device) -> None:
        """Nothing to build: the encoder has no non-persistent buffers."""


UNUSED = ("vision_tower.head.",)
"""SigLIP's pooling head, saved where the vision config sets vision_use_head: Gemma 3 reads the
tower's last hidden states, never the head's output."""


def param_name(name: str) -> str | None:
    """Our parameter for a checkpoint name; None for a name outside PREFIXES."""
    for prefix in TOWER_PREFIXES:
        if name.startswith(prefix):
            return "vision_tower." + tower_param_name(name.removeprefix(prefix))
    for prefix in PROJECTOR_PREFIXES:
        if name.startswith(prefix):
            rest = name.removeprefix(prefix)
            if rest.startswith("mm_input_projection."):  # our Linear's name, no checkpoint's
                return None
            if rest == PROJECTION_WEIGHT:
                rest = "mm_input_projection.weight"
            return "multi_modal_projector." + rest
    return None
