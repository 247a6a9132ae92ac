"""`appliance profile`: probe the device, plan memory for a model, print the arithmetic.

The plan is the one `appliance serve` and `LLM()` run for the same model, pins and machine
(engine.planner, the device read by engine.planner.read_device; a preset name plans the folder
`serve --load-format random` serves). `--json` prints one JSON object for machines; `--measure`
times copy bandwidth and the bf16 matmul rate on a GPU and builds the planned engine (random
weights) to compare predicted and measured memory after warm-up (appliance.profile_measure); on
a CPU it says so and keeps the estimates. Exit status: 0 planned, 2 a pinned setting cannot fit
(one message names the setting to change and its new value).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from appliance.model_presets import preset_names
from appliance.probe import probe
from appliance.profile_measure import measure_plan, report_dict
from appliance.profile_registry import is_registry_profile, run_registry_profile
from appliance.profile_report import print_tables, probe_dict
from engine.planner import GIB, IMAGE_LIMITS, PINNABLE, Device, PlanError

TARGETS = ("target_num_seqs", "useful_context", "typical_len")
"""The planner's targets profile lets you set (engine.planner.PlanRequest fields)."""


def add_profile_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from appliance.settings import add_engine_flags, serve_options

    p = subparsers.add_parser(
        "profile",
        help="probe the GPU and plan memory",
        description="Probe the GPU (or CPU), plan weights, KV cache and batch limits for a "
        "model with the KV-cache formula, and print the arithmetic: the plan `serve` runs. "
        "Pinned settings are kept or refused with the one number to change.",
    )
    p.add_argument(
        "--model",
        action="append",
        help="HF model folder, .gguf file or a preset in profiles/models "
        f"({', '.join(preset_names())}); default: the embedded SmolLM2. Repeat it as NAME=PATH "
        "for the memory split of several models served together",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--measure", action="store_true", help="measure bandwidth, matmul and memory (GPU)"
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu"],
        default="auto",
        help="cpu: plan for the CPU even when a GPU is visible",
    )
    p.add_argument("--target-num-seqs", type=int, default=8, help="concurrency to leave room for")
    p.add_argument("--useful-context", type=int, default=4096, help="...at this many tokens")
    p.add_argument("--typical-len", type=int, default=1024, help="a typical request's tokens")
    add_engine_flags(
        p,
        (
            *PINNABLE,
            "block_size",
            "enforce_eager",
            "quant_block_size",
            "quantize_embeddings",
            "max_encoder_tokens",
        ),
    )
    for name in IMAGE_LIMITS:  # serve's image limits size a multimodal model's encoder peak
        serve_options()[name].add_flag(p)
    return p


def plan_targets(args: argparse.Namespace) -> dict:
    """The planner's targets and the image limits the flags set (PlanRequest fields)."""
    targets = {t: getattr(args, t) for t in TARGETS}
    limits = {n: getattr(args, n, None) for n in IMAGE_LIMITS}
    return {**targets, **{n: v for n, v in limits.items() if v is not None}}


def model_folder(model: str | None) -> tuple[str, str]:
    """(display name, model folder) for a preset name (the folder `serve --load-format random`
    serves), a HF folder, a .gguf file, or the embedded model."""
    from appliance.model_presets import resolve_served_model
    from engine.models.loader import resolve_model_folder

    folder = resolve_model_folder(resolve_served_model(model, "random"))
    return model or f"embedded ({folder.name})", str(folder)


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


def run_profile(args: argparse.Namespace) -> int:
    from appliance.settings import engine_pins
    from engine.config import EngineConfig
    from engine.models.model_config import ModelConfig
    from engine.planner import read_device
    from engine.startup.planned_config import plan_engine

    if isinstance(args.model, list):  # the flag repeats: several models, or one
        if is_registry_profile(args.model):
            return run_registry_profile(args, plan_targets(args), model_folder)
        args.model = args.model[0]
    notes: list[str] = []
    try:
        name, folder = model_folder(args.model)
        model = ModelConfig.from_folder(folder)
        pins = EngineConfig.from_kwargs(**engine_pins(args))
        found = probe()
        notes += found.problems
        kind = "cpu" if args.device == "cpu" else found.device
        if args.device == "cpu" and found.device == "cuda":
            notes.append("--device cpu: planning for the CPU")
        device = read_device(kind)
    except ValueError as exc:
        print(f"appliance profile: {exc}", file=sys.stderr)
        return 2
    measured: dict[str, float] = {}
    memory = None
    try:
        result, config = plan_engine(pins, model, kind, device, **plan_targets(args))
    except PlanError as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "setting": exc.setting, "value": exc.value}))
        else:
            print(f"appliance profile: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # settings the checkpoint refuses (its own quantization)
        print(f"appliance profile: {exc}", file=sys.stderr)
        return 2
    if args.measure and kind != "cuda":
        notes.append("--measure needs a CUDA GPU; not available here: showing estimates")
    elif args.measure:
        measured, memory = _measure(folder, config, device, notes)
    if args.json:
        report = {
            "model": name,
            "probe": probe_dict(found),
            "device": asdict(device),
            "plan": result.to_dict(),
            "engine_config": result.engine_kwargs(),
            "measured": measured or None,
            "notes": notes,
            "memory_check": report_dict(memory) if memory else None,
        }
        print(json.dumps(report, indent=2))
    else:
        print_tables(name, model, found, device, result, measured, notes, memory)
    return 0


def _measure(folder: str, config, device: Device, notes: list[str]):
    """(bandwidth and matmul readings, the engine's MemoryReport or None) on the GPU."""
    measured, memory = {}, None
    try:
        measured = measure_gpu()
    except Exception as exc:  # a failed measurement leaves the estimates in place
        notes.append(f"measurement failed ({type(exc).__name__}: {exc}): estimates only")
    try:
        memory = measure_plan(folder, config, device)
    except Exception as exc:
        notes.append(f"memory measurement failed ({type(exc).__name__}: {exc}): estimates only")
    return measured, memory
