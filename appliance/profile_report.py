"""`appliance profile`'s report: the device, the memory plan with its arithmetic, the settings
with their reasons, and predicted vs measured memory after warm-up (rich tables)."""

from __future__ import annotations

import sys
from dataclasses import asdict

from appliance.probe import Probe
from appliance.profile_measure import memory_table
from engine.planner import GIB, Device, Plan, plan_settings
from engine.planner.formulas import ELEMENT_BYTES


def probe_dict(found: Probe) -> dict:
    out = asdict(found)
    out["device"] = found.device
    return out


def _na(value: object, fmt: str = "{}") -> str:
    return "n/a" if value is None else fmt.format(value)


def params_text(model) -> str:
    """The model's parameters for the report: total, and active where experts make them differ
    ("30.53 B params, 3.35 B active")."""
    text = f"{model.num_params / 1e9:.2f} B params"
    if model.num_active_params != model.num_params:
        text += f", {model.num_active_params / 1e9:.2f} B active"
    return text


def vision_text(model) -> str:
    """The vision encoder's parameters for the report ("0.42 B params, the image encoder")."""
    from engine.models.vision_params import vision_params

    return f"{vision_params(model.vision).total / 1e9:.2f} B params, the image encoder"


def kv_text(model, p: Plan) -> str:
    """The KV formula with the model's numbers: "2 x 32 layers x 8 KV heads x 128 x 2 B
    (bfloat16)", counting only the layers that hold K/V (a hybrid model's full layers), and
    naming the layers' head dims where they differ."""
    layers = model.kv_layers()
    shapes = sorted({(a.num_kv_heads, a.head_dim) for a in map(model.layer_attention, layers)})
    heads, dim = shapes[-1]
    per_element = p.kv_bytes_per_token // (
        2 * sum(a.num_kv_heads * a.head_dim for a in map(model.layer_attention, layers))
    )
    which = "layers" if len(layers) == model.num_layers else "layers holding K/V"
    if len(shapes) > 1:
        dims = " / ".join(f"{h} KV heads x {d}" for h, d in shapes)
        return f"2 x {len(layers)} {which} x ({dims}) x {per_element} B ({p.kv_cache_dtype})"
    return (
        f"2 x {len(layers)} {which} x {heads} KV heads x {dim} x {per_element} B "
        f"({p.kv_cache_dtype})"
    )


def state_text(model, p: Plan) -> str:
    """The state formula with the model's numbers: linear layers x (fp32 recurrent state +
    conv state)."""
    shape = model.linear_attention
    rec = f"{shape.num_value_heads} x {shape.key_head_dim} x {shape.value_head_dim} x 4 B"
    conv = f"{shape.conv_dim} x {shape.conv_kernel - 1} x {ELEMENT_BYTES[p.dtype]} B"
    return f"{len(model.linear_layer_ids())} linear layers x ({rec} recurrent + {conv} conv)"


def print_tables(
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
            ("bf16", _na(gpu.bf16_supported)),
            ("SMs", _na(gpu.num_sms)),
            ("bandwidth (NVML)", _na(gpu.bandwidth_gbs, "{:.0f} GB/s")),
            ("driver", _na(gpu.driver_version)),
        ]
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
    mem = Table(title=f"Memory plan: {name}", show_header=True)
    for col in ("item", "bytes", "arithmetic"):
        mem.add_column(col)
    in_use = p.others_bytes
    total = f"{g(p.total_bytes)} x {p.gpu_memory_utilization:.2f}"
    mem.add_row("budget", g(p.budget_bytes), f"{total} - {g(in_use)} in use by others")
    stored = p.weight_format or p.quantization
    mem.add_row("weights", g(p.weight_bytes), f"{params_text(model)}, {stored}")
    mem.add_row(
        "activation peak", g(p.activation_bytes), f"a step of {p.max_num_batched_tokens} tokens"
    )
    if p.vision_weight_bytes:
        mem.add_row("vision weights", g(p.vision_weight_bytes), vision_text(model))
        mem.add_row(
            "vision activations",
            g(p.vision_activation_bytes),
            "a step's images in the encoder (max_encoder_tokens) + a request's image rows",
        )
    if p.device == "cuda":  # a CPU engine has neither
        mem.add_row("CUDA graph pool", g(p.graph_pool_bytes), "decode graphs up to max_num_seqs")
    mem.add_row("allocator cache", g(p.allocator_bytes), "cached blocks beyond live tensors")
    if p.device == "cuda":
        mem.add_row("CUDA context", g(p.cuda_context_bytes), "from the class profile")
    mem.add_row("safety margin", g(p.margin_bytes), "3% of the budget, at least 256 MiB")
    mem.add_row("KV bytes / token", f"{p.kv_bytes_per_token:,} B", kv_text(model, p))
    if p.state_bytes_per_sequence:
        mem.add_row(
            "state / sequence",
            f"{p.state_bytes_per_sequence:,} B",
            state_text(model, p),
        )
        mem.add_row(
            "state pool",
            g(p.state_pool_bytes),
            f"{p.max_num_seqs} slots x {p.state_bytes_per_sequence:,} B (before the KV pool)",
        )
    per_token = f"{p.kv_bytes_per_token:,} B"
    if p.draft_weight_bytes:
        mem.add_row("draft model weights", g(p.draft_weight_bytes), "speculative decoding, 16-bit")
        mem.add_row(
            "draft KV / token",
            f"{p.draft_kv_bytes_per_token:,} B",
            "the draft model's K/V, in the same blocks",
        )
        per_token = f"({p.kv_bytes_per_token:,} + {p.draft_kv_bytes_per_token:,}) B"
    mem.add_row(
        "KV pool",
        g(p.kv_pool_bytes),
        f"{p.num_kv_blocks} blocks x {p.block_size} tokens x {per_token}",
    )
    mem.add_row(
        "concurrency",
        f"{p.concurrency_at_max_len} @ {p.max_model_len}",
        f"{p.concurrency_at_typical_len} @ a typical {p.typical_len} tokens",
    )
    if device.bandwidth_gbs:
        floor_s = p.decode_bytes([p.typical_len]) / (device.bandwidth_gbs * 1e9)
        read = "active weights" if p.expert_bytes else "weights"
        read += " + KV + state read and written" if p.state_bytes_per_sequence else " + KV"
        mem.add_row(
            "decode floor",
            f"{1 / floor_s:,.0f} tok/s",
            f"one sequence: ({read}) / {device.bandwidth_gbs:.0f} GB/s",
        )
    console.print(mem)

    settings = Table(title="Settings (engine config)")
    for col in ("setting", "value", "why"):
        settings.add_column(col)
    for name, value, why in plan_settings(p.to_dict()):
        settings.add_row(name, str(value), why)
    console.print(settings)
    if memory is not None:
        console.print(memory_table(memory))
    if not p.target_met:
        console.print("[yellow]the target concurrency does not fit; see quantization above[/]")
    for note in notes:
        console.print(f"note: {note}")
