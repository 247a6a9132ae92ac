"""Random quantized weights for the kernel tests: every int8 value, or every pair of 4-bit
codes, appears in the first row(s)."""

from __future__ import annotations

import torch

from engine.quant.bnb import code_table


def random_quant_weight(
    kind: str, n: int, k: int, group: int, device: str, quant_type: str = "nf4", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Generator]:
    """(qweight, scales, code table or None, the generator, to draw more from): int8 [N, K]
    with fp32 row scales, or packed int4 [N, K / 2] with fp32 [N, K / group] scales."""
    g = torch.Generator().manual_seed(seed)
    if kind == "int8":
        q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        q.view(-1)[:256] = torch.arange(-128, 128, dtype=torch.int8)[: q.numel()]
        s, code = torch.rand(n, generator=g) / 127, None
    else:
        q = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
        q.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)[: q.numel()]
        s, code = torch.rand(n, k // group, generator=g), code_table(quant_type).to(device)
    return q.to(device), s.to(device), code, g
