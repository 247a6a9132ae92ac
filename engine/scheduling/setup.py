"""The block manager and scheduler of one engine, built for its model: the prefix cache on or
off, state slots for linear-attention layers, whole prompts for an encoder, whole images where a
model's image tokens attend to each other both ways, and the limits its images are checked
against."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import EngineConfig
from engine.memory.state_pool import SlotAllocator
from engine.models.model_config import ModelConfig
from engine.multimodal import image_token_id
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler


@dataclass
class Scheduling:
    block_manager: BlockManager
    scheduler: Scheduler
    image_limits: tuple[int | None, int | None]
    """check_images' (image token id, most tokens of one image); (None, None): text only."""


def build_scheduling(
    config: EngineConfig,
    model_config: ModelConfig,
    num_blocks: int,
    is_encoder: bool,
    vision_both_ways: bool | None,
) -> Scheduling:
    """vision_both_ways: None for a model without images, else whether its image tokens attend
    to each other both ways."""
    extra = f"{config.dtype}|{config.kv_cache_dtype}|{config.quantization}".encode()
    # A model with linear-attention layers keeps a state slot per running sequence and no
    # prefix cache: a cached prefix would skip the tokens its state is built from.
    slots = SlotAllocator(config.max_num_seqs) if model_config.linear_layer_ids() else None
    # An encoder's tokens attend both ways: a cached prefix's states depend on what follows.
    caching = config.prefix_caching and slots is None and not is_encoder
    block_manager = BlockManager(num_blocks, config.block_size, caching, extra, slots)
    scheduler = Scheduler(
        config,
        block_manager,
        whole_prompts=is_encoder,
        whole_images=bool(vision_both_ways),
    )
    limits: tuple[int | None, int | None] = (None, None)
    if vision_both_ways is not None:
        whole = config.max_num_batched_tokens if vision_both_ways else None
        limits = (image_token_id(model_config.vision or {}), whole)
    return Scheduling(block_manager, scheduler, limits)
