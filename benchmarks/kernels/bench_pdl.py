"""Batch-1 decode's kernel chain without attention, with and without programmatic dependent
launch (engine/kernels/pdl.py): 32 Llama-3-8B layers of RMSNorm, qkv, o, RMSNorm + residual,
gate_up, SiLU-and-mul, down, through the engine's own batch-1 kernels, in one CUDA graph.

    python -m benchmarks.kernels.bench_pdl [--kinds bf16,int8,int4] [--layers 32]

Prints, per weight kind and PDL setting, the chain's time per layer, and what it would be if
every weight byte moved at the copy bandwidth measured in the same run. The difference between
PDL off and on is the launch, ramp-up and tail time PDL hides. Needs bitsandbytes for int4's
NF4 table only (engine/quant/bnb.py code_table; no bitsandbytes call). The kernel configs are
timed first, as the engine's start-up does (engine/startup/kernel_choices.py,
engine/quant/quant_choices.py).
"""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks.floor import measure_hardware
from engine.kernels.gemv import gemv, gemv_silu_mul
from engine.kernels.rmsnorm import rms_norm
from engine.kernels.silu_mul import silu_and_mul
from engine.quant.bnb import code_table
from engine.quant.dispatch import fused_silu, quant_linear
from engine.quant.quant_choices import choose_gemv, choose_gemv_silu
from engine.quant.weight_format import QuantizedWeight
from engine.startup.kernel_choices import KernelChoices, choose_gemv_configs, gemv_key
from engine.timing import graph_seconds

HIDDEN, QKV, INTER = 4096, 6144, 14336
SHAPES = {
    "qkv": (QKV, HIDDEN),
    "o": (HIDDEN, HIDDEN),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
}


def make_layer(kind: str, g: torch.Generator) -> dict:
    """One layer's four weights in `kind`'s layout (random values, as the benchmarks use): a
    bf16 tensor, or a QuantizedWeight."""
    layer = {}
    for name, (n, k) in SHAPES.items():
        if kind == "bf16":
            layer[name] = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
            layer[name] /= k**0.5
        elif kind == "int8":
            q = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
            s = torch.rand(n, device="cuda", generator=g) / 127 / k**0.5
            layer[name] = QuantizedWeight(q, s, None, None, 64)
        else:
            q = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8, generator=g)
            s = torch.rand(n, k // 64, device="cuda", generator=g) / k**0.5
            layer[name] = QuantizedWeight(q, s, code_table("nf4").cuda(), None, 64)
    return layer


def choose(kind: str, layers: list[dict], choices: KernelChoices) -> None:
    """Time the batch-1 kernels' configs over these layers' weights, as start-up does."""
    if kind == "bf16":
        linears = [(layer[s], None) for layer in layers for s in SHAPES]
        choose_gemv_configs(linears, choices, [(layer["gate_up"], None) for layer in layers])
        return
    for s in SHAPES:
        same = [layer[s] for layer in layers]
        choose_gemv(same, choices.quant, torch.bfloat16)
        if s == "gate_up":
            choose_gemv_silu(same, choices.quant, torch.bfloat16)


def linear(x: torch.Tensor, weight, choices: KernelChoices) -> torch.Tensor:
    if isinstance(weight, QuantizedWeight):
        return quant_linear(x, weight, choices.quant.kernels_for(weight, x.dtype))
    config = choices.gemv.get(gemv_key(weight, None))
    if config is None:
        return torch.nn.functional.linear(x, weight)
    return gemv(x, weight, None, config)


def gate_up_act(x: torch.Tensor, weight, choices: KernelChoices) -> torch.Tensor:
    """silu_and_mul(linear(x, weight)), fused where the engine's choice fused it."""
    if isinstance(weight, QuantizedWeight):
        out = fused_silu(x, weight, choices.quant.kernels_for(weight, x.dtype))
    else:
        config = choices.gemv_silu.get(gemv_key(weight, None))
        out = None if config is None else gemv_silu_mul(x, weight, None, config)
    return out if out is not None else silu_and_mul(linear(x, weight, choices))


def chain(layers: list[dict], x: torch.Tensor, norm: torch.Tensor, choices) -> torch.Tensor:
    residual = x
    h = rms_norm(x, norm, 1e-5)
    for layer in layers:
        qkv = linear(h, layer["qkv"], choices)
        o = linear(qkv[:, :HIDDEN], layer["o"], choices)  # attention's output stands in
        h, residual = rms_norm(o, norm, 1e-5, residual)
        act = gate_up_act(h, layer["gate_up"], choices)
        h, residual = rms_norm(linear(act, layer["down"], choices), norm, 1e-5, residual)
    return h


def weight_bytes(layer: dict) -> int:
    tensors = [
        t for w in layer.values() for t in ([w] if torch.is_tensor(w) else [w.qweight, w.scales])
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


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
        choices = KernelChoices()
        choose(kind, layers, choices)
        floor_us = weight_bytes(layers[0]) / bw * 1e6
        results = {}
        for setting in ("0", "1"):
            os.environ["APPLIANCE_PDL"] = setting
            out = chain(layers, x, norm, choices)
            run = lambda ls=layers, cs=choices: chain(ls, x, norm, cs)  # noqa: E731
            us = graph_seconds(run, replays=20) * 1e6 / len(layers)
            results[setting] = (us, out.float())
        same = torch.equal(results["0"][1], results["1"][1])
        off, on = results["0"][0], results["1"][0]
        print(
            f"{kind}: per layer {off:.1f} us PDL off, {on:.1f} us PDL on "
            f"({off - on:+.1f} us), floor {floor_us:.1f} us; "
            f"outputs {'identical' if same else 'DIFFER'}"
        )
        layers.clear()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
