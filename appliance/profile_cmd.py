"""`appliance profile`: probe the device, plan memory for a model, print the arithmetic.

`--json` prints one JSON object for machines; `--measure` times copy bandwidth and the bf16
matmul rate on a GPU and builds the planned engine (random weights) to compare predicted and
measured memory after warm-up (appliance.profile_measure); on a CPU it says so and keeps the
estimates. Exit status: 0 planned, 2 a pinned setting cannot fit (one message names the
setting to change and its new value).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from appliance.model_presets import PRESETS_DIR
from appliance.plan_model import GIB, Device, Plan, PlanError, PlanRequest
from appliance.planner import plan
from appliance.probe import Probe
from appliance.profile_measure import measure_plan, memory_table, report_dict
from appliance.serve_plan import probe_for

PINS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "num_kv_blocks",
        "gpu_memory_utilization", "dtype", "kv_cache_dtype", "quantization")  # fmt: skip


def add_profile_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile",
        help="probe the GPU and plan memory",
        description="Probe the GPU (or CPU), plan weights, KV cache and batch limits for a "
        "model with the KV-cache formula, and print the arithmetic. Pinned settings are kept "
        "or refused with the one number to change.",
    )
    p.add_argument("--model", help="HF model folder, .gguf file or a preset in profiles/models "
                   f"({', '.join(sorted(f.stem for f in PRESETS_DIR.glob('*.json')))}); "
                   "default: the embedded SmolLM2")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--measure", action="store_true", help="measure bandwidth, matmul and memory (GPU)"
    )
    p.add_argument("--device", choices=["auto", "cpu"], default="auto",
                   help="cpu: plan for the CPU even when a GPU is visible")  # fmt: skip
    p.add_argument("--target-num-seqs", type=int, default=8, help="concurrency to leave room for")
    p.add_argument("--useful-context", type=int, default=4096, help="...at this many tokens")
    p.add_argument("--typical-len", type=int, default=1024, help="a typical request's tokens")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    p.add_argument("--enforce-eager", action="store_true", help="plan without CUDA graphs")
    for name in PINS[:4]:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help="pin this setting")
    p.add_argument("--gpu-memory-utilization", type=float, help="pin the share of memory used")
    p.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--kv-cache-dtype", choices=["auto", "float32", "float16", "bfloat16", "int8"])
    p.add_argument("--quantization", choices=["auto", "none", "int8", "int4"])
    return p


def load_model_config(model: str | None):
    """ModelConfig of a preset name, a HF folder, a .gguf file, or the embedded model."""
    from engine.models.config import ModelConfig

    if model is not None and (PRESETS_DIR / f"{model}.json").is_file():
        return model, ModelConfig.from_dict(json.loads((PRESETS_DIR / f"{model}.json").read_text()))
    from engine.models.loader import resolve_model_folder

    folder = resolve_model_folder(model)
    return (model or f"embedded ({Path(folder).name})"), ModelConfig.from_folder(folder)


def measure_gpu() -> dict[str, float]:
    """Copy bandwidth (GB/s, read + write) and bf16 matmul rate (TFLOP/s) on cuda:0."""
    import torch

    from engine.timing import seconds_per_call

    def timed(fn, repeat: int) -> float:
        return seconds_per_call(fn, "cuda", repeat, warmup=1)

    src = torch.empty(GIB // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), 20)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm_s = timed(lambda: a @ a, 20)
    return {"copy_gbs": 2 * src.numel() / copy_s / 1e9, "bf16_tflops": 2 * 8192**3 / mm_s / 1e12}


def _request(args: argparse.Namespace) -> PlanRequest:
    pins = {n: getattr(args, n, None) for n in PINS}
    return PlanRequest(
        target_num_seqs=args.target_num_seqs, useful_context=args.useful_context,
        typical_len=args.typical_len, block_size=args.block_size,
        enforce_eager=args.enforce_eager, **pins,
    )  # fmt: skip


def run_profile(args: argparse.Namespace) -> int:
    try:
        name, model = load_model_config(args.model)
        req = _request(args)
        found, device, notes = probe_for(args.device)
    except ValueError as exc:
        print(f"appliance profile: {exc}", file=sys.stderr)
        return 2
    measured: dict[str, float] = {}
    memory = None
    try:
        result = plan(model, device, req)
        if args.measure and found.device != "cuda":
            notes.append("--measure needs a CUDA GPU; not available here: showing estimates")
        elif args.measure:
            measured, memory = _measure(args, result, notes)
        if memory is not None:  # the plan again, with the measured activation peak
            result = plan(
                model, device, replace(req, measured_activation_bytes=memory.measured.activation)
            )
    except PlanError as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "setting": exc.setting, "value": exc.value}))
        else:
            print(f"appliance profile: {exc}", file=sys.stderr)
        return 2
    if args.json:
        report = {"model": name, "probe": _probe_dict(found), "device": asdict(device),
                  "plan": result.to_dict(), "engine_config": result.engine_kwargs(),
                  "measured": measured or None, "notes": notes,
                  "memory_check": report_dict(memory) if memory else None}  # fmt: skip
        print(json.dumps(report, indent=2))
    else:
        _print_tables(name, model, found, device, result, measured, notes, memory)
    return 0


def _measure(args: argparse.Namespace, result: Plan, notes: list[str]):
    """(bandwidth and matmul readings, the engine's MemoryReport or None) on the GPU."""
    measured, memory = {}, None
    try:
        measured = measure_gpu()
    except Exception as exc:  # a failed measurement leaves the estimates in place
        notes.append(f"measurement failed ({type(exc).__name__}: {exc}): estimates only")
    try:
        memory = measure_plan(args.model, result, args.enforce_eager)
    except Exception as exc:
        notes.append(f"memory measurement failed ({type(exc).__name__}: {exc}): estimates only")
    return measured, memory


def _probe_dict(found: Probe) -> dict:
    out = asdict(found)
    out["device"] = found.device
    return out


def _na(value: object, fmt: str = "{}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _print_tables(
    name, model, found: Probe, device: Device, p: Plan, measured, notes, memory=None
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)
    gpu, cpu = found.gpu, found.cpu
    hw = Table(title="Device", show_header=False)
    profile = found.profile.name if found.profile else "n/a (unknown GPU)"
    rows = [("plans for", f"{device.kind}: {device.name}"), ("class profile", profile)]
    if gpu is not None:
        cc = gpu.compute_capability
        total = _na(gpu.total_bytes and gpu.total_bytes / GIB, "{:.2f}")
        free = _na(gpu.free_bytes and gpu.free_bytes / GIB, "{:.2f}")
        rows += [
            ("GPU memory total / free", f"{total} / {free} GiB"),
            ("compute capability", _na(cc and f"{cc[0]}.{cc[1]}")),
            ("bf16", _na(gpu.bf16_supported)), ("SMs", _na(gpu.num_sms)),
            ("bandwidth (NVML)", _na(gpu.bandwidth_gbs, "{:.0f} GB/s")),
            ("driver", _na(gpu.driver_version)),
        ]  # fmt: skip
    ram = cpu.total_ram_bytes and cpu.total_ram_bytes / GIB
    avail = cpu.available_ram_bytes and cpu.available_ram_bytes / GIB
    cores = f"{_na(cpu.num_cores)} cores / {_na(cpu.num_threads)} threads"
    rows += [
        ("CPU", f"{_na(cpu.name)}, {cores}"),
        ("RAM total / available", f"{_na(ram, '{:.1f}')} / {_na(avail, '{:.1f}')} GiB"),
    ]
    for key, value in measured.items():
        rows.append((f"measured {key}", f"{value:.1f}"))
    for row in rows:
        hw.add_row(*row)
    console.print(hw)

    g = lambda n: f"{n / GIB:.2f} GiB"  # noqa: E731
    kv_b = p.kv_bytes_per_token // (2 * model.num_layers * model.num_kv_heads * model.head_dim)
    mem = Table(title=f"Memory plan: {name}", show_header=True)
    for col in ("item", "bytes", "arithmetic"):
        mem.add_column(col)
    in_use = int(p.total_bytes * p.gpu_memory_utilization) - p.budget_bytes
    total = f"{g(p.total_bytes)} x {p.gpu_memory_utilization:.2f}"
    mem.add_row("budget", g(p.budget_bytes), f"{total} - {g(in_use)} in use by others")
    mem.add_row(
        "weights", g(p.weight_bytes), f"{model.num_params / 1e9:.2f} B params, {p.quantization}"
    )
    how = "measured" if p.activation_measured else "estimate"
    mem.add_row(
        "activation peak", g(p.activation_bytes), f"{p.max_num_batched_tokens} tokens ({how})"
    )
    mem.add_row("CUDA graph pool", g(p.graph_pool_bytes), "decode graphs up to max_num_seqs")
    mem.add_row("CUDA context", g(p.cuda_context_bytes), "from the class profile")
    mem.add_row("safety margin", g(p.margin_bytes), "3% of the budget, at least 256 MiB")
    mem.add_row("KV bytes / token", f"{p.kv_bytes_per_token:,} B",
                f"2 x {model.num_layers} layers x {model.num_kv_heads} KV heads x "
                f"{model.head_dim} x {kv_b} B ({p.kv_cache_dtype})")  # fmt: skip
    mem.add_row("KV pool", g(p.kv_pool_bytes), f"{p.num_kv_blocks} blocks x {p.block_size} "
                f"tokens x {p.kv_bytes_per_token:,} B")  # fmt: skip
    mem.add_row("concurrency", f"{p.concurrency_at_max_len} @ {p.max_model_len}",
                f"{p.concurrency_at_typical_len} @ a typical {p.typical_len} tokens")  # fmt: skip
    if device.bandwidth_gbs:
        floor_s = (p.weight_bytes + p.typical_len * p.kv_bytes_per_token) / (
            device.bandwidth_gbs * 1e9
        )
        mem.add_row("decode floor", f"{1 / floor_s:,.0f} tok/s", "one sequence: (weights + KV)"
                    f" / {device.bandwidth_gbs:.0f} GB/s")  # fmt: skip
    console.print(mem)

    settings = Table(title="Settings (engine config)")
    for col in ("setting", "value", "why"):
        settings.add_column(col)
    for key, value in p.engine_kwargs().items():
        settings.add_row(key, str(value), p.reasons.get(key, ""))
    console.print(settings)
    if memory is not None:
        console.print(memory_table(memory))
    if not p.target_met:
        console.print("[yellow]the target concurrency does not fit; see quantization above[/]")
    for note in notes:
        console.print(f"note: {note}")
