"""`appliance profile --model NAME=PATH --model NAME=PATH ...`: the memory split of several
models on one device, planned in order as `appliance serve` would load them all: each model's
plan takes the memory the earlier ones leave (their planned bytes count as used), so the table
shows what each one gets and the first that no longer fits."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace

from appliance.model_memory import planned_bytes
from appliance.model_specs import model_specs
from appliance.options import SettingsError
from engine.planner import GIB, PlanError

MIB = 1024**2


def is_registry_profile(models: list[str] | None) -> bool:
    return bool(models) and (len(models) > 1 or any("=" in m for m in models))


def run_registry_profile(
    args: argparse.Namespace, targets: dict, model_folder: Callable[[str], tuple[str, str]]
) -> int:
    """Plan every named model in order (the planner's `targets`; `model_folder` resolves a
    path or preset); exit 2 when one cannot fit beside the earlier ones."""
    from appliance.settings import engine_pins
    from engine.config import EngineConfig
    from engine.models.model_config import ModelConfig
    from engine.planner import read_device
    from engine.startup.planned_config import plan_engine

    try:
        specs = model_specs(args.model, None, {}, "default")
    except SettingsError as exc:
        print(f"appliance profile: {exc}")
        return 2
    kind = "cpu" if args.device == "cpu" else _device_kind()
    device = read_device(kind)
    rows, status, before = [], 0, 0
    for spec in specs:
        row: dict = {"model": spec.name, "path": spec.path, "earlier_models_bytes": before}
        try:
            _, folder = model_folder(spec.path)
            model = ModelConfig.from_folder(folder)
            pins = EngineConfig.from_kwargs(**engine_pins(args))
            plan, _ = plan_engine(pins, model, kind, device, **targets)
        except (PlanError, ValueError) as exc:
            row["error"], status = str(exc), 2
            rows.append(row)
            break
        plan_dict = plan.to_dict()
        held = planned_bytes(plan_dict) or 0
        row.update(
            planned_bytes=held,
            weight_bytes=plan.weight_bytes,
            kv_pool_bytes=plan.kv_pool_bytes,
            max_num_seqs=plan_dict.get("max_num_seqs"),
            max_model_len=plan_dict.get("max_model_len"),
        )
        rows.append(row)
        device = replace(device, used_bytes=device.used_bytes + held)
        before += held
    if args.json:
        print(json.dumps({"device": kind, "total_bytes": device.total_bytes, "models": rows}))
    else:
        print(f"{kind}: {device.total_bytes / GIB:.1f} GiB; models planned in order")
        print(
            f"{'model':<20} {'planned':>10} {'weights':>10} {'KV pool':>10} {'seqs':>5} {'len':>7}"
        )
        for r in rows:
            if "error" in r:
                print(f"{r['model']:<20} does not fit: {r['error']}")
                continue
            mib = [
                f"{r[k] / MIB:.1f} MiB" for k in ("planned_bytes", "weight_bytes", "kv_pool_bytes")
            ]
            print(
                f"{r['model']:<20} {mib[0]:>10} {mib[1]:>10} {mib[2]:>10} "
                f"{r['max_num_seqs']:>5} {r['max_model_len']:>7}"
            )
    return status


def _device_kind() -> str:
    from appliance.probe import probe

    return probe().device
