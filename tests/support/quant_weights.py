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


def projection_rows(model, name: str) -> torch.Tensor:
    """A checkpoint projection ("model.layers.0.self_attn.k_proj") read from our model: its rows
    of the (fused) QuantLinear, dequantized to fp32 in the natural input order."""
    from engine.models.weights import QKV_GATE_UP

    cfg = model.config
    path, proj = name.removeprefix("model.").rsplit(".", 1)
    fused, shard = QKV_GATE_UP.get(proj, (proj, 0))
    weight = model.get_submodule(f"{path}.{fused}").dequantize()
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    sizes = {"qkv_proj": [q, kv, kv], "gate_up_proj": [cfg.intermediate_size] * 2}
    if fused not in sizes:
        return weight
    return weight.narrow(0, sum(sizes[fused][:shard]), sizes[fused][shard])
