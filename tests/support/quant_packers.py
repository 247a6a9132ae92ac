"""AWQ and GPTQ checkpoints written from the formats' public descriptions (not the libraries'
code): a weight quantized to integer codes with fp16 scales and zero points per group, packed
as each format stores it, plus the exact fp32 weight those tensors stand for.

- AWQ (GEMM): qweight int32 [K, N / 8], each word eight consecutive output columns' 4-bit codes
  in the interleaved order 0, 2, 4, 6, 1, 3, 5, 7 from the low bits up; qzeros int32
  [K / G, N / 8] the same way; scales fp16 [K / G, N]. W = (q - z) * s.
- GPTQ: qweight int32 [K * B / 32, N] (words along K), qzeros int32 [K / G, N * B / 32] (words
  along N; "gptq" v1 stores z - 1), scales fp16 [K / G, N], g_idx int32 [K] (with desc_act the
  columns of a group are scattered). sym puts z at 2^(B - 1).
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from engine.quant.weight_format import PROJECTIONS
from tests.support.tiny_models import byte_tokenizer

AWQ_INTERLEAVE = (0, 2, 4, 6, 1, 3, 5, 7)


def _words(values: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """[R, C] codes -> int32 [R, C * bits / 32]: consecutive columns into one word from the low
    bits up (value i of a word is column order[i] of its run)."""
    per = 32 // bits
    runs = values.to(torch.int64).view(values.shape[0], -1, per)  # [R, C / per, per]
    if order is not None:
        runs = runs[:, :, list(order)]
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    words = (runs << shifts).sum(-1)  # [R, C / per], 0 .. 2^32 - 1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _quantize(w: torch.Tensor, groups: torch.Tensor, num_groups: int, bits: int, sym: bool):
    """w fp32 [N, K], the group of each column -> (codes [N, K], scales fp16 [N, G], zeros
    [N, G]) from each row's group min / max."""
    top = (1 << bits) - 1
    lo = torch.stack([w[:, groups == g].amin(1) for g in range(num_groups)], 1).clamp(max=0)
    hi = torch.stack([w[:, groups == g].amax(1) for g in range(num_groups)], 1).clamp(min=0)
    if sym:
        scale = torch.maximum(-lo, hi) * 2 / top
        zeros = torch.full_like(scale, 1 << (bits - 1))
    else:
        scale = (hi - lo) / top
    scale = scale.clamp(min=1e-6).half()  # the stored scale is what the codes are made with
    if not sym:
        zeros = (-lo / scale.float()).round().clamp(0, top)
    s, z = scale.float()[:, groups], zeros[:, groups]  # [N, K]
    codes = ((w / s).round() + z).clamp(0, top)
    return codes.to(torch.int64), scale, zeros.to(torch.int64)


def dequantized(codes, scales, zeros, groups) -> torch.Tensor:
    """The exact fp32 weight: (q - z) * s, column k in group groups[k]."""
    return (codes - zeros[:, groups]).float() * scales.float()[:, groups]


def pack_awq(w: torch.Tensor, group: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """w fp32 [N, K] -> (AWQ GEMM tensors, the fp32 weight they stand for)."""
    n, k = w.shape
    groups = torch.arange(k) // group
    codes, scales, zeros = _quantize(w, groups, k // group, 4, sym=False)
    parts = {
        "qweight": _words(codes.t(), 4, AWQ_INTERLEAVE),
        "qzeros": _words(zeros.t(), 4, AWQ_INTERLEAVE),
        "scales": scales.t().contiguous(),
    }
    return parts, dequantized(codes, scales, zeros, groups)


def pack_gptq(
    w: torch.Tensor, bits: int, group: int, sym: bool, order: torch.Tensor | None, v1: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """w fp32 [N, K] -> (GPTQ tensors, the fp32 weight they stand for). order (desc_act): the
    columns in the order they were quantized; group g is order[g * group : (g + 1) * group]."""
    n, k = w.shape
    g_idx = torch.arange(k) // group
    if order is not None:
        g_idx = torch.empty_like(g_idx)
        g_idx[order] = torch.arange(k) // group
    codes, scales, zeros = _quantize(w, g_idx, k // group, bits, sym)
    stored = (zeros - 1) & ((1 << bits) - 1) if v1 else zeros
    parts = {
        "qweight": _words(codes, bits).t().contiguous(),  # [N, K * B / 32] -> words along K
        "qzeros": _words(stored.t(), bits),
        "scales": scales.t().contiguous(),
        "g_idx": g_idx.to(torch.int32),
    }
    return parts, dequantized(codes, scales, zeros, g_idx)


_SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up"}
_SHARED_INPUT |= {"up_proj": "gate_up"}

CHECKPOINTS = {  # name -> quantization_config
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm",
            "zero_point": True},
    "gptq-4bit-sym-v1": {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True,
                         "desc_act": False},
    "gptq-4bit-asym-desc_act": {"quant_method": "gptq", "bits": 4, "group_size": 32,
                                "sym": False, "desc_act": True},
    "gptq-8bit-sym-channel-v2": {"quant_method": "gptq", "bits": 8, "group_size": -1,
                                 "sym": True, "desc_act": False,
                                 "checkpoint_format": "gptq_v2"},
    "gptq-8bit-asym-desc_act": {"quant_method": "gptq", "bits": 8, "group_size": 32,
                                "sym": False, "desc_act": True},
}  # fmt: skip


def _packer(qc: dict):
    """pack(prefix, w) -> (tensors, exact fp32 weight) for a quantization_config; desc_act's
    column order is drawn once per input that fused projections share."""
    orders: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(1)

    def pack(prefix: str, w: torch.Tensor):
        k = w.shape[1]
        group = k if qc["group_size"] == -1 else qc["group_size"]
        if qc["quant_method"] == "awq":
            return pack_awq(w, group)
        order = None
        if qc["desc_act"]:
            layer, proj = prefix.rsplit(".", 1)
            key = f"{layer.rsplit('.', 1)[0]}.{_SHARED_INPUT.get(proj, proj)}"
            order = orders.setdefault(key, torch.randperm(k, generator=gen))
        v1 = qc.get("checkpoint_format", "gptq") == "gptq"
        return pack_gptq(w, qc["bits"], group, qc["sym"], order, v1)

    return pack


def write_checkpoint(source, folder, qc: dict) -> dict[str, torch.Tensor]:
    """The tiny model in `source` (a tests/support/tiny_models.py folder) packed by `qc` into
    `folder`; returns each projection's exact fp32 weight."""
    pack, tensors, exact = _packer(qc), {}, {}
    for name, t in load_file(source / "model.safetensors").items():
        prefix = name.removesuffix(".weight")
        if name == prefix or prefix.rsplit(".", 1)[-1] not in PROJECTIONS:
            tensors[name] = t
            continue
        parts, exact[prefix] = pack(prefix, t.float())
        tensors |= {f"{prefix}.{part}": value for part, value in parts.items()}
    folder.mkdir(exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"quantization_config": qc}))
    byte_tokenizer().save_pretrained(folder)
    return exact
