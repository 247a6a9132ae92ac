"""Batch-1 decode's kernel chain without attention, with and without programmatic dependent
launch (engine/kernels/pdl.py): 32 Llama-3-8B layers of RMSNorm, qkv, o, RMSNorm + residual,
gate_up, SiLU-and-mul, down, through the engine's own batch-1 kernels, in one CUDA graph.

    PYTHONPATH=. python scripts/bench_pdl.py [--kinds bf16,int8,int4] [--layers 32]

Prints, per weight kind and PDL setting, the chain's time per layer, and what it would be if
every weight byte moved at the copy bandwidth measured in the same run. The difference between
PDL off and on is the launch, ramp-up and tail time PDL hides. Needs bitsandbytes for int4's
NF4 table only through engine.models.quant.code_table (no bitsandbytes call).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.kernels.gemv import (  # noqa: E402
    choose_configs,
    fused_silu_config,
    gemv,
    gemv_config,
    gemv_silu_mul,
)
from engine.kernels.rmsnorm import rms_norm  # noqa: E402
from engine.kernels.silu_mul import silu_and_mul  # noqa: E402
from engine.kernels.wq_choice import choose_configs as choose_wq  # noqa: E402
from engine.kernels.wq_choice import choose_silu, silu_config_for  # noqa: E402
from engine.kernels.wq_gemv import wq_matmul  # noqa: E402
from engine.kernels.wq_splitk import wq_gemv_silu  # noqa: E402
from engine.models.quant import code_table  # noqa: E402
from engine.timing import graph_seconds  # noqa: E402
from scripts.bench_floor import measure_hardware  # noqa: E402

HIDDEN, QKV, INTER = 4096, 6144, 14336
SHAPES = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN),
          "down": (HIDDEN, INTER)}  # fmt: skip


def make_layer(kind: str, g: torch.Generator) -> dict:
    """One layer's four weights in `kind`'s layout (random values, as the benchmarks use)."""
    layer = {}
    for name, (n, k) in SHAPES.items():
        if kind == "bf16":
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
            layer[name] = (w,)
        elif kind == "int8":
            q = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
            layer[name] = (q, torch.rand(n, device="cuda", generator=g) / 127 / k**0.5)
        else:
            q = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8, generator=g)
            s = torch.rand(n, k // 64, device="cuda", generator=g) / k**0.5
            layer[name] = (q, s, code_table("nf4").cuda(), None, 64)
    return layer


def linear(x: torch.Tensor, weight: tuple) -> torch.Tensor:
    if len(weight) == 1:
        config = gemv_config(weight[0], None)
        if config is None:
            return torch.nn.functional.linear(x, weight[0])
        return gemv(x, weight[0], None, config)
    if len(weight) == 2:
        return wq_matmul(x, weight[0], weight[1])
    return wq_matmul(x, *weight[:4], group_size=weight[4])


def gate_up_act(x: torch.Tensor, weight: tuple) -> torch.Tensor:
    """silu_and_mul(linear(x, weight)), fused where the engine's choice fused it."""
    if len(weight) == 1:
        config = fused_silu_config(weight[0], None)
        if config is not None:
            return gemv_silu_mul(x, weight[0], None, config)
    else:
        layer = weight if len(weight) == 5 else (*weight, None, None, 64)
        config = silu_config_for(layer, x)
        if config is not None:
            return wq_gemv_silu(x, *layer, config)
    return silu_and_mul(linear(x, weight))


def chain(layers: list[dict], x: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    residual = x
    h = rms_norm(x, norm, 1e-5)
    for layer in layers:
        qkv = linear(h, layer["qkv"])
        o = linear(qkv[:, :HIDDEN], layer["o"])  # attention's output stands in as q's slice
        h, residual = rms_norm(o, norm, 1e-5, residual)
        act = gate_up_act(h, layer["gate_up"])
        h, residual = rms_norm(linear(act, layer["down"]), norm, 1e-5, residual)
    return h


def weight_bytes(layer: dict) -> int:
    return sum(t.numel() * t.element_size() for w in layer.values() for t in w[:2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default="bf16,int8,int4")
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args(argv)
    bw = measure_hardware(torch.device("cuda"), torch.bfloat16).bandwidth
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g)
    norm = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    for kind in args.kinds.split(","):
        layers = [make_layer(kind, g) for _ in range(args.layers)]
        if kind == "bf16":
            choose_configs(
                [(layer[s][0], None) for layer in layers for s in SHAPES],
                [(layer["gate_up"][0], None) for layer in layers],
            )
        else:
            for s in SHAPES:
                same = [layer[s] if kind == "int4" else (*layer[s], None, None, 64)
                        for layer in layers]  # fmt: skip
                choose_wq(same, torch.bfloat16)
                if s == "gate_up":
                    choose_silu(same, torch.bfloat16)
        floor_us = weight_bytes(layers[0]) / bw * 1e6
        results = {}
        for setting in ("0", "1"):
            os.environ["APPLIANCE_PDL"] = setting
            out = chain(layers, x, norm)
            us = graph_seconds(lambda ls=layers: chain(ls, x, norm), replays=20) * 1e6 / len(layers)
            results[setting] = (us, out.float())
        same = torch.equal(results["0"][1], results["1"][1])
        off, on = results["0"][0], results["1"][0]
        print(f"{kind}: per layer {off:.1f} us PDL off, {on:.1f} us PDL on "
              f"({off - on:+.1f} us), floor {floor_us:.1f} us; "
              f"outputs {'identical' if same else 'DIFFER'}")  # fmt: skip
        layers.clear()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
