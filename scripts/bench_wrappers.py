"""Host cost of our Triton kernel wrappers (argument checks, output allocation, launch-config
lookup) on the calls one Llama-3-8B layer makes in a 1,024-token prefill, with each kernel
launch replaced by a no-op: the Python share of an eager prefill that is ours to cut, apart
from Triton's own launch cost and cuBLAS.

    .venv/bin/python scripts/bench_wrappers.py [--tokens 1024] [--calls 2000]

Runs on the CPU (TRITON_INTERPRET=1 lets the wrappers take CPU tensors; nothing is computed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels import prefill_attention as pa  # noqa: E402
from engine.kernels import rmsnorm, rope, silu_mul, store_kv  # noqa: E402

KERNELS = [
    (rmsnorm, "_rms_norm_kernel"),
    (rope, "_rope_kernel"),
    (store_kv, "_store_kv_kernel"),
    (pa, "_prefill_kernel"),
    (silu_mul, "_silu_mul_kernel"),
]


class NoLaunch:
    """kernel[grid](...) that does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def layer_calls(tokens: int) -> dict:
    """name -> a call of one wrapper with Llama-3-8B head shapes (small hidden and MLP widths:
    the wrappers' cost does not depend on them)."""
    heads, kv_heads, head_dim, bf16 = 32, 8, 128, torch.bfloat16
    x = torch.randn(tokens, 256, dtype=bf16)
    residual, weight = x.clone(), torch.ones(256, dtype=bf16)
    q = torch.randn(tokens, heads, head_dim, dtype=bf16)
    k = torch.randn(tokens, kv_heads, head_dim, dtype=bf16)
    cos, sin = torch.randn(8192, head_dim), torch.randn(8192, head_dim)
    blocks = -(-tokens // 16)
    k_cache = torch.zeros(blocks, 16, kv_heads, head_dim, dtype=bf16)
    v_cache = k_cache.clone()
    tables = torch.arange(blocks, dtype=torch.int32)[None]
    starts = torch.tensor([0, tokens], dtype=torch.int32)
    lens = torch.tensor([tokens], dtype=torch.int32)
    gate_up = torch.randn(tokens, 512, dtype=bf16)
    positions, slots = torch.arange(tokens), torch.arange(tokens)
    return {
        "rms_norm + residual (x2)": lambda: rmsnorm.rms_norm(x, weight, 1e-5, residual),
        "apply_rope": lambda: rope.apply_rope(q, k, positions, cos, sin),
        "store_kv": lambda: store_kv.store_kv(k, k, k_cache, v_cache, slots),
        "prefill_attention": lambda: pa.prefill_attention(
            q, k_cache, v_cache, tables, starts, lens, tokens, 0.1
        ),
        "silu_and_mul": lambda: silu_mul.silu_and_mul(gate_up),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    real = [(mod, name, getattr(mod, name)) for mod, name in KERNELS]
    for mod, name, _ in real:
        setattr(mod, name, NoLaunch())
    try:
        per_call = {}
        for name, call in layer_calls(args.tokens).items():
            call()
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            per_call[name] = (time.perf_counter() - start) / args.calls * 1e6
    finally:
        for mod, name, kernel in real:
            setattr(mod, name, kernel)
    for name, us in per_call.items():
        print(f"  {name:26s} {us:7.1f} us")
    layer = sum(per_call.values()) + per_call["rms_norm + residual (x2)"]
    print(f"one layer's wrappers (two RMSNorms): {layer:.0f} us, x32 layers {layer * 32e-3:.1f} ms")
    return per_call


if __name__ == "__main__":
    main()
