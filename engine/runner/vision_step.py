"""The vision encoder's part of a step: which rows of the packed batch are image
placeholders, the encoder rows that replace their embeddings, and the encoder cache.

An image is encoded once while a request holding it lives: its rows are kept by hash, so a
chunked prefill that splits an image's placeholders over several steps, a recomputation after
preemption, or a second request with the same image reads them again instead of re-encoding.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from engine.multimodal import ImageInput
from engine.runner.forward_context import ImageSpan
from engine.scheduling.request import Request
from engine.scheduling.scheduler import ScheduledBatch


class VisionStep:
    """Owns the encoder cache of one model runner."""

    def __init__(self, vision: nn.Module, device: torch.device, both_ways: bool) -> None:
        """both_ways: the text model's image tokens attend to each other both ways, so each
        image's query rows are listed as an ImageSpan for attention."""
        self.vision = vision
        self.device = device
        self.both_ways = both_ways
        self.rows_of: dict[bytes, torch.Tensor] = {}
        """Image hash -> its encoder rows [length, hidden], on the device."""
        self.holders: dict[bytes, set[str]] = {}
        """Image hash -> ids of the live requests that hold it."""

    def prepare(
        self, batch: ScheduledBatch, query_start_loc: list[int]
    ) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, list[ImageSpan]]:
        """((rows, values), spans) for the batch's image placeholders, encoding the images
        not cached yet (in one call); (None, []) when the step holds none."""
        rows: list[int] = []
        pieces: list[tuple[ImageInput, int, int]] = []
        spans: list[ImageSpan] = []
        for i, (req, num_new) in enumerate(zip(batch.requests, batch.num_new_tokens)):
            if not req.has_images_ahead:
                continue
            start = req.num_computed_tokens
            end = start + num_new
            for image in req.images:
                if not image.overlaps(start, end):
                    continue
                lo, hi = max(image.offset, start), min(image.end, end)
                first_row = query_start_loc[i] + lo - start
                rows.extend(range(first_row, first_row + hi - lo))
                pieces.append((image, lo - image.offset, hi - image.offset))
                if self.both_ways:
                    spans.append(ImageSpan(i, first_row, first_row + hi - lo, lo, image.end))
                self._hold(req, image)
        if not pieces:
            return None, []
        self._encode([image for image, _, _ in pieces], batch)
        values = torch.cat([self.rows_of[image.hash][a:b] for image, a, b in pieces])
        index = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        return (index, values), spans

    def release(self, req: Request) -> None:
        """Drop a finished request's hold on its images' rows."""
        for image in req.images:
            holders = self.holders.get(image.hash)
            if holders is None:
                continue
            holders.discard(req.request_id)
            if not holders:
                del self.holders[image.hash]
                self.rows_of.pop(image.hash, None)

    @property
    def num_cached(self) -> int:
        return len(self.rows_of)

    def _hold(self, req: Request, image: ImageInput) -> None:
        self.holders.setdefault(image.hash, set()).add(req.request_id)

    def _encode(self, images: list[ImageInput], batch: ScheduledBatch) -> None:
        """Encode the distinct images not cached; record the time on their requests."""
        todo = list({i.hash: i for i in images if i.hash not in self.rows_of}.values())
        if not todo:
            return
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        outputs = self.vision(todo)
        if cuda:
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        ms = round(seconds * 1000, 2)
        for image, out in zip(todo, outputs):
            if out.shape[0] != image.length:
                raise RuntimeError(
                    f"the vision encoder gave {out.shape[0]} rows for an image with "
                    f"{image.length} placeholders"
                )
            self.rows_of[image.hash] = out
        hashes = {image.hash for image in todo}
        for req in batch.requests:
            mine = sum(1 for image in req.images if image.hash in hashes)
            if mine:
                req.record("images_encoded", images=mine, step_images=len(todo), ms=ms)
                req.metrics.encoder_s += seconds


def both_ways(model: nn.Module) -> bool:
    """Whether any attention layer of `model` lets image tokens attend both ways."""
    return any(getattr(m, "images_both_ways", False) for m in model.modules())
