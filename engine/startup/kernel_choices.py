"""KernelChoices: the kernel configs and fast paths one engine chose at start-up by timing on its
device, and the timing for the 16-bit ones (the batch-1 GEMV, RoPE fused with the KV store);
the quantized linears' part is engine/quant/quant_choices.py.

The model runner owns one KernelChoices and fills it (choose_kernels) before it captures the
decode graphs; each module then holds its own chosen config or path (Linear.gemv_config and
.silu_config, QuantLinear.kernels, PagedAttention.fuse_rope_store), so nothing is looked up or
timed while a step runs, and two engines in one process never share a choice. The dicts here,
keyed by weight shape or head layout, let a second call (a re-capture after the KV pool shrank)
time nothing twice. Kernel modules are imported on use: without Triton none is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine import timing
from engine.kernels import fused_kernels_enabled, triton_available
from engine.models.layers import Linear, PagedAttention
from engine.models.rope_tables import RotaryEmbedding
from engine.quant.quant_choices import QuantChoices, choose_quant_linears

log = logging.getLogger(__name__)


@dataclass
class KernelChoices:
    """One engine's start-up kernel choices."""

    gemv: dict[tuple, tuple | None] = field(default_factory=dict)
    """16-bit (N, K, dtype, device, has bias) -> the split-K GEMV config that beat cuBLAS at
    one row (engine/kernels/gemv.py), or None where cuBLAS won."""
    gemv_silu: dict[tuple, tuple | None] = field(default_factory=dict)
    """Gate-and-up shapes (the same keys) -> the gemv_silu_mul config that beat the GEMV then
    silu_and_mul, or None where the two steps were faster."""
    rope_store: dict[tuple, bool] = field(default_factory=dict)
    """(q heads, kv heads, head_dim, dtype, device) -> rope_store was equal to RoPE then the KV
    store and faster at one token."""
    quant: QuantChoices = field(default_factory=QuantChoices)
    """The quantized linears' choices (engine/quant/quant_choices.py)."""


def choose_kernels(
    model: nn.Module, choices: KernelChoices, dtype: torch.dtype, max_rows: int, eager: bool
) -> None:
    """Time the decode kernels over the model's own weights and hand each module its choice
    (CUDA; before capturing, never during). max_rows: the most rows a decode step runs. eager
    (no CUDA graphs): only the batch-1 GEMV configs, no fused forms or batched kernels."""
    choose_batch1_linears(model, choices, fused=not eager)
    choose_quant_linears(model, choices.quant, dtype, max_rows, eager)
    if not eager:
        choose_rope_store(model, choices)


def gemv_key(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    return (*weight.shape, weight.dtype, weight.device, bias is not None)


def choose_batch1_linears(model: nn.Module, choices: KernelChoices, fused: bool = True) -> None:
    """Time cuBLAS against the split-K GEMV for each Linear shape of the model, over its own
    weights (and, with `fused`, the gate-and-up projections' fused SiLU form), so decode
    graphs capture the faster; each Linear gets its configs (CUDA only; before capture)."""
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
    if not named or not named[0][1].weight.is_cuda or not triton_available():
        return
    pairs = {n: (m.weight, m.bias) for n, m in named}
    fused = fused and fused_kernels_enabled()
    gated = [p for n, p in pairs.items() if n.endswith("gate_up_proj") and fused]
    choose_gemv_configs(list(pairs.values()), choices, gated)
    for name, module in named:
        key = gemv_key(module.weight, module.bias)
        module.gemv_config = choices.gemv.get(key)
        module.silu_config = choices.gemv_silu.get(key) if name.endswith("gate_up_proj") else None


def choose_gemv_configs(
    linears: list[tuple[torch.Tensor, torch.Tensor | None]],
    choices: KernelChoices,
    gated: list[tuple[torch.Tensor, torch.Tensor | None]] = (),
) -> None:
    """Decide between cuBLAS and each config for every (weight, bias) shape in `linears`: timed
    in a CUDA graph that calls it once per weight of that shape, as a decode step does (so
    no weight is still in L2 at its next call, unlike timing one small weight repeatedly;
    eager timing would add Triton's host launch cost, which graph replay does not pay).
    Results must match F.linear. Then, for `gated` (gate-and-up) shapes, the fused SiLU form
    against the two steps."""
    from engine.kernels import gemv

    groups: dict[tuple, list] = {}
    for w, b in linears:
        if w.is_cuda and w.dim() == 2 and w.dtype in gemv._DTYPES and w.stride(1) == 1:
            groups.setdefault(gemv_key(w, b), []).append((w, b))
    for key, pairs in groups.items():
        if key not in choices.gemv:
            choices.gemv[key] = _fastest_gemv(pairs)
    gated_groups: dict[tuple, list] = {}
    for w, b in gated:
        gated_groups.setdefault(gemv_key(w, b), []).append((w, b))
    for key, pairs in gated_groups.items():
        if key not in choices.gemv_silu and key in choices.gemv:
            choices.gemv_silu[key] = _fastest_gemv_silu(pairs, choices.gemv[key])
    for key in groups:
        fused = choices.gemv_silu.get(key)
        fused = f", with silu-mul {fused}" if fused else ""
        log.info("batch-1 linear %dx%d: %s%s", key[0], key[1], choices.gemv[key] or "cuBLAS", fused)
    torch.cuda.empty_cache()


def _fastest_gemv(pairs: list[tuple[torch.Tensor, torch.Tensor | None]]):
    """The fastest config for these same-shape weights, or None where cuBLAS wins."""
    from engine.kernels.gemv import CONFIGS, gemv

    w0, b0 = pairs[0]
    x = torch.randn(1, w0.shape[1], dtype=w0.dtype, device=w0.device)
    ref = F.linear(x, w0, b0).float()

    def call(cfg, pair):
        return F.linear(x, *pair) if cfg is None else gemv(x, *pair, cfg)

    return timing.fastest_config([None, *CONFIGS], call, pairs, ref)


def _fastest_gemv_silu(pairs: list, config: tuple[int, int, int] | None):
    """Time the two steps (silu_and_mul after the chosen GEMV: cuBLAS where config is None)
    against gemv_silu_mul with each of FUSED_CONFIGS over these gate-and-up weights: the
    fastest fused config, or None where the two steps won."""
    from engine.kernels.gemv import FUSED_CONFIGS, gemv, gemv_silu_mul
    from engine.kernels.silu_mul import silu_and_mul

    w0 = pairs[0][0]
    x = torch.randn(1, w0.shape[1], dtype=w0.dtype, device=w0.device)

    def two_steps(pair):
        if config is None:
            return silu_and_mul(F.linear(x, *pair))
        return silu_and_mul(gemv(x, *pair, config))

    ref = two_steps(pairs[0]).float()
    fused = [c for c in FUSED_CONFIGS if gemv_silu_mul(x, *pairs[0], c) is not None]

    def call(cfg, pair):
        return two_steps(pair) if cfg is None else gemv_silu_mul(x, *pair, cfg)

    return timing.fastest_config([None, *fused], call, pairs, ref)


def choose_rope_store(model: nn.Module, choices: KernelChoices) -> None:
    """Decide on the device whether decode steps fuse RoPE with the KV-cache write (CUDA, fused
    kernels on, a 16-bit cache bound; before capturing the decode graphs) and tell each
    attention layer (PagedAttention.fuse_rope_store): once per layer shape, with that shape's
    RoPE tables (Gemma 4's full layers are wider than its sliding ones)."""
    if not fused_kernels_enabled():
        return
    for (num_heads, num_kv_heads, head_dim), (rope, layers) in rope_store_groups(model).items():
        attn = layers[0]
        if attn.k_scales is not None or attn.k_cache is None or not attn.k_cache.is_cuda:
            continue
        dtype = attn.k_cache.dtype  # a 16-bit cache holds the activation dtype
        shape = (num_heads, num_kv_heads, head_dim)
        won = rope_store_wins(choices, *shape, dtype, rope.cos, rope.sin, len(layers))
        for layer in layers:
            layer.fuse_rope_store = won


def rope_store_groups(
    model: nn.Module,
) -> dict[tuple[int, int, int], tuple[RotaryEmbedding, list[PagedAttention]]]:
    """The attention layers that may fuse RoPE with the KV write, by (heads, KV heads, head
    dim): each with the RoPE its layers rotate by. Left out: layers with a partial RoPE (never
    fused, PagedAttention.rope_and_store) and layers that read another layer's K/V."""
    groups: dict[tuple[int, int, int], tuple[RotaryEmbedding, list[PagedAttention]]] = {}
    for module in model.modules():
        attn, rope = getattr(module, "attn", None), getattr(module, "rope", None)
        if not isinstance(attn, PagedAttention) or not isinstance(rope, RotaryEmbedding):
            continue
        if rope.is_partial or attn.kv_shared:
            continue
        shape = (attn.num_heads, attn.num_kv_heads, attn.head_dim)
        groups.setdefault(shape, (rope, []))[1].append(attn)
    return groups


def rope_store_wins(
    choices: KernelChoices,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_layers: int = 32,
) -> bool:
    """Whether decode steps use rope_store with a `dtype` cache (the activation dtype): it
    must equal apply_rope then store_kv bit for bit on random inputs, and take less time over
    `num_layers` calls of one token in a CUDA graph (a batch-1 step's layers). Scratch caches,
    not the model's. A device that cannot run it (timing.config_errors) keeps the two."""
    from engine.kernels.rope import apply_rope
    from engine.kernels.rope_store import rope_store
    from engine.kernels.store_kv import store_kv

    device = cos.device
    key = (num_heads, num_kv_heads, head_dim, dtype, device)
    if key in choices.rope_store:
        return choices.rope_store[key]
    g = torch.Generator(device=device).manual_seed(0)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv0 = torch.randn(1, width, device=device, dtype=dtype, generator=g)
    caches = torch.zeros(2, 4, 16, num_kv_heads, head_dim, device=device, dtype=dtype)
    slots = torch.tensor([21], device=device)
    pos = torch.tensor([7], device=device)
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]

    def run(fused: bool, qkv: torch.Tensor) -> torch.Tensor:
        qkv.copy_(qkv0)
        q, k, v = (t.view(1, -1, head_dim) for t in qkv.split(sizes, -1))
        if fused:
            rope_store(q, k, v, pos, cos, sin, caches[0], caches[1], slots)
        else:
            apply_rope(q, k, pos, cos, sin)
            store_kv(k, v, caches[0], caches[1], slots)
        return qkv

    items = [torch.empty_like(qkv0) for _ in range(num_layers)]
    ref = (run(False, items[0]).clone(), caches.clone())
    try:
        equal = all(map(torch.equal, (run(True, items[0]), caches), ref))
        if not equal:
            log.warning("rope_store differs from RoPE + KV store on this device: not used")
    except timing.config_errors() as e:  # a launch this device cannot run: keep the two
        log.warning("rope_store cannot run on this device (%s): not used", e)
        equal = False
    won = equal and timing.fastest_config([False, True], run, items, ref[0]) is True
    choices.rope_store[key] = won
    log.info("decode steps: RoPE + KV store %s", "fused" if won else "as two kernels")
    del items
    torch.cuda.empty_cache()  # the memory check reads the graph pool's growth after this
    return won
