"""One Gated DeltaNet layer's kernels (engine/kernels/conv1d.py, gdn.py, gdn_chunked.py) at
Qwen3.5-27B's shape, bf16 activations and fp32 state: decode steps timed in a CUDA graph against
the bytes they must move, prefills timed per call; and, where the `fla` package
(flash-linear-attention) is importable, its fused_recurrent_gated_delta_rule and
chunk_gated_delta_rule on the same inputs, checked to agree with ours. fla is not a dependency
of the appliance.

    python -m benchmarks.kernels.bench_gdn [--batches 1,8,64,256] [--prefills 512,4096]
        [--block-v 32] [--out FILE.json]

Decode floor: each sequence's recurrent state read and written (Hv * Dk * Dv fp32 twice) and
its conv state read and written, each token's conv input, g and beta read and o written, at
the copy bandwidth measured in the same run (ours also writes the conv output and reads it back
as q, k, v). Prefill floor: the same per-token bytes plus one state write, at that bandwidth
(the chunked form is also bound by its matmuls; the recurrent kernel by its per-token
latency: the rows say which it is). Times are one layer's: a step costs them times the model's
linear-attention layers. "err vs ref" compares the whole step (our conv output, rounded to
bf16, feeds our rule) with gdn_ref's; the recurrent column's error is on gdn_ref's conv output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.floor import measure_hardware
from engine.kernels import conv1d, gdn, gdn_chunked, gdn_ref
from engine.timing import graph_seconds, seconds_per_call

AGREE_ATOL = 1e-2
"""Max abs difference counted as agreeing, outputs (~0.1 here) and fp32 states (~1) alike: bf16
matmul operands in a chunked form cost ~5e-4 and ~4e-3 (tests/test_gdn_kernels.py)."""


def make_step(args, lengths: list[int], fresh: bool, g: torch.Generator) -> dict:
    """A packed step on the GPU: conv input x [T, conv_dim] bf16, conv weight, g and beta fp32
    [T, Hv], state pools with a slot per sequence drawn at random, and the packing tensors."""
    hk, hv, dk, dv = args.num_k_heads, args.num_v_heads, args.key_dim, args.value_dim
    conv_dim = 2 * hk * dk + hv * dv
    num_tokens, num_seqs = sum(lengths), len(lengths)
    num_slots = max(2 * num_seqs, 8)
    starts = torch.tensor([0, *lengths]).cumsum(0).int()
    cuda = dict(device="cuda")
    a = torch.randn(num_tokens, hv, generator=g)
    return dict(
        x=torch.randn(num_tokens, conv_dim, generator=g).to(torch.bfloat16).cuda(),
        weight=(torch.randn(conv_dim, args.kernel, generator=g) * 0.5).to(torch.bfloat16).cuda(),
        g=(-(torch.rand(hv, generator=g) * 4 + 0.1) * torch.nn.functional.softplus(a)).cuda(),
        beta=torch.sigmoid(torch.randn(num_tokens, hv, generator=g)).cuda(),
        conv_states=torch.randn(num_slots, conv_dim, args.kernel - 1, generator=g)
        .to(torch.bfloat16)
        .cuda(),
        states=(torch.randn(num_slots, hv, dk, dv, generator=g) * 0.1).cuda(),
        query_start_loc=starts.cuda(),
        slots=torch.randperm(num_slots, generator=g)[:num_seqs].int().cuda(),
        fresh=torch.full((num_seqs,), fresh, dtype=torch.bool, **cuda),
    )


def split_qkv(args, mixed: torch.Tensor):
    """q, k [T, Hk, Dk] and v [T, Hv, Dv]: views of the conv output, as the layer takes them."""
    t, key_width = mixed.shape[0], args.num_k_heads * args.key_dim
    q = mixed[:, :key_width].view(t, args.num_k_heads, args.key_dim)
    k = mixed[:, key_width : 2 * key_width].view(t, args.num_k_heads, args.key_dim)
    v = mixed[:, 2 * key_width :].view(t, args.num_v_heads, args.value_dim)
    return q, k, v


def ours(args, s: dict, states, conv_states, num_decodes: int) -> torch.Tensor:
    """conv1d then the gated delta rule as a step runs it (decodes by the recurrent kernel,
    prefills by the chunked ones): the layer's core between its projections."""
    pack = (s["query_start_loc"], s["slots"], s["fresh"])
    mixed = conv1d.causal_conv1d_varlen(s["x"], s["weight"], None, conv_states, *pack)
    q, k, v = split_qkv(args, mixed)
    return gdn_chunked.gated_delta_rule_mixed(
        q, k, v, s["g"], s["beta"], states, *pack, num_decodes
    )


def step_bytes(args, num_tokens: int, num_seqs: int, state_reads: int) -> int:
    """The least a step must move: the conv input x, g and beta read and o written a token;
    the conv and recurrent states written a sequence, and read `state_reads` times."""
    hv, dk, dv = args.num_v_heads, args.key_dim, args.value_dim
    conv_dim = 2 * args.num_k_heads * dk + hv * dv
    per_token = conv_dim * 2 + hv * 4 * 2 + hv * dv * 2
    state = hv * dk * dv * 4 + conv_dim * (args.kernel - 1) * 2
    return num_tokens * per_token + num_seqs * state * (1 + state_reads)


def fla_ops():
    """fla's gated delta rule entry points, or None where fla is not installed."""
    try:
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except ImportError:
        return None
    return fused_recurrent_gated_delta_rule, chunk_gated_delta_rule


def fla_call(op, args, s: dict, mixed: torch.Tensor, initial: torch.Tensor):
    """op on one packed batch (cu_seqlens) from the gathered initial states [N, Hv, Dk, Dv];
    q and k repeated to the value heads. Returns (o [T, Hv, Dv], final states)."""
    q, k, v = split_qkv(args, mixed)
    group = args.num_v_heads // args.num_k_heads
    q, k = (t.repeat_interleave(group, dim=1) for t in (q, k))
    o, final = op(
        q=q[None],
        k=k[None],
        v=v.contiguous()[None],
        g=s["g"][None],
        beta=s["beta"][None],
        scale=args.key_dim**-0.5,
        initial_state=initial,
        output_final_state=True,
        cu_seqlens=s["query_start_loc"].long(),
        use_qk_l2norm_in_kernel=True,
    )
    return o[0], final


def agreement(ours_o, ours_states, other_o, other_states) -> float:
    return max(
        (ours_o.float() - other_o.float()).abs().max().item(),
        (ours_states - other_states).abs().max().item(),
    )


def run_case(args, lengths: list[int], fresh: bool, decode: bool, fla, hw, console) -> dict:
    s = make_step(args, lengths, fresh, torch.Generator().manual_seed(len(lengths)))
    slots = s["slots"].long()
    pack = (s["query_start_loc"], s["slots"], s["fresh"])
    # correctness first, on copies of the pools: ours against the PyTorch reference
    states, conv_states = s["states"].clone(), s["conv_states"].clone()
    num_decodes = len(lengths) if decode else 0
    out = ours(args, s, states, conv_states, num_decodes)
    final = states[slots].clone()  # the timed calls below advance the pools further
    ref_states, ref_conv = s["states"].clone(), s["conv_states"].clone()
    mixed = gdn_ref.causal_conv1d_varlen(s["x"], s["weight"], None, ref_conv, *pack)
    q, k, v = split_qkv(args, mixed)
    ref = gdn_ref.gated_delta_rule_varlen(q, k, v, s["g"], s["beta"], ref_states, *pack)
    row = dict(lengths=lengths[:4] + ["..."] * (len(lengths) > 4), num_seqs=len(lengths))
    row["err_vs_ref"] = agreement(out, final, ref, ref_states[slots])

    time = graph_seconds if decode else (lambda fn: seconds_per_call(fn, "cuda", 5, 1))
    row["conv_us"] = (
        time(lambda: conv1d.causal_conv1d_varlen(s["x"], s["weight"], None, conv_states, *pack))
        * 1e6
    )
    rule = (q, k, v, s["g"], s["beta"])
    recurrent_states = s["states"].clone()
    recurrent = gdn.gated_delta_rule_varlen(*rule, recurrent_states, *pack, block_v=args.block_v)
    row["recurrent_err"] = agreement(recurrent, recurrent_states[slots], ref, ref_states[slots])
    row["recurrent_us"] = 1e6 * time(
        lambda: gdn.gated_delta_rule_varlen(*rule, states, *pack, block_v=args.block_v)
    )
    if not decode:
        for size in map(int, args.chunk_sizes.split(",")):
            row[f"chunked{size}_us"] = 1e6 * time(
                lambda size=size: gdn_chunked.gated_delta_rule_chunked(
                    *rule, states, *pack, chunk_size=size
                )
            )
    row["ours_us"] = time(lambda: ours(args, s, states, conv_states, num_decodes)) * 1e6
    num_tokens = sum(lengths)
    nbytes = step_bytes(args, num_tokens, len(lengths), 0 if fresh else 1)
    row["floor_us"] = nbytes / hw.bandwidth * 1e6
    if not decode:
        row["ref_chunked_us"] = (
            time(
                lambda: gdn_ref.gated_delta_rule_chunked(
                    q, k, v, s["g"], s["beta"], ref_states, *pack
                )
            )
            * 1e6
        )
    if fla is not None:
        initial = torch.where(
            s["fresh"].view(-1, 1, 1, 1), 0.0, s["states"][slots]
        )  # fla takes the states gathered, not slot ids
        for name, op in zip(("fla_recurrent", "fla_chunk"), fla, strict=True):
            try:
                fo, fs = fla_call(op, args, s, mixed, initial)
                row[f"{name}_err"] = agreement(out, final, fo, fs)
                row[f"{name}_us"] = (
                    seconds_per_call(
                        lambda op=op: fla_call(op, args, s, mixed, initial), "cuda", 5, 1
                    )
                    * 1e6
                )
            except Exception as e:  # an fla version with another signature: report, go on
                console.print(f"[red]{name}: {type(e).__name__}: {str(e)[:200]}")
    return row


def chunked_cell(row: dict) -> str:
    sizes = [
        (k[len("chunked") : -len("_us")], v) for k, v in row.items() if k.startswith("chunked")
    ]
    return ", ".join(f"{size}: {us:.1f}" for size, us in sizes) or "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Qwen3.5-27B's Gated DeltaNet (its public config.json; 48 of its 64 layers are linear)
    ap.add_argument("--num-k-heads", type=int, default=16)
    ap.add_argument("--num-v-heads", type=int, default=48)
    ap.add_argument("--key-dim", type=int, default=128)
    ap.add_argument("--value-dim", type=int, default=128)
    ap.add_argument("--kernel", type=int, default=4)
    ap.add_argument("--batches", default="1,8,64,256", help="decode batch sizes")
    ap.add_argument("--prefills", default="512,4096", help="prompt lengths, one fresh sequence")
    ap.add_argument("--block-v", type=int, default=gdn.BLOCK_V)
    ap.add_argument(
        "--chunk-sizes",
        default="64,32",
        help=f"gdn_chunked chunk sizes timed apart (a step runs {gdn_chunked.CHUNK})",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gdn: needs a CUDA GPU")
        return 1
    hw = measure_hardware(torch.device("cuda"), torch.bfloat16)
    fla = fla_ops()
    console = Console()
    console.print(
        f"copy bandwidth {hw.bandwidth / 1e12:.2f} TB/s; fla "
        f"{'importable' if fla else 'not installed: its columns stay empty'}; one layer, "
        f"Hk {args.num_k_heads} Hv {args.num_v_heads} Dk {args.key_dim} Dv {args.value_dim}"
    )
    rows = []
    cases = [([1] * int(b), False, True) for b in args.batches.split(",")]
    cases += [([int(n)], True, False) for n in args.prefills.split(",")]
    for lengths, fresh, decode in cases:
        rows.append(dict(decode=decode, **run_case(args, lengths, fresh, decode, fla, hw, console)))
    table = Table(
        "step",
        "conv us",
        "recurrent us (err)",
        "chunked us (by chunk size)",
        "step us",
        "floor us",
        "% of floor",
        "err vs ref",
        "torch chunked us",
        "fla recurrent us (err)",
        "fla chunk us (err)",
    )
    for r in rows:
        step = f"decode x{r['num_seqs']}" if r["decode"] else f"prefill {r['lengths'][0]}"

        def fla_cell(name, r=r):
            if f"{name}_us" not in r:
                return "-"
            return f"{r[f'{name}_us']:.1f} ({r[f'{name}_err']:.2g})"

        table.add_row(
            step,
            f"{r['conv_us']:.1f}",
            f"{r['recurrent_us']:.1f} ({r['recurrent_err']:.2g})",
            chunked_cell(r),
            f"{r['ours_us']:.1f}",
            f"{r['floor_us']:.1f}",
            f"{100 * r['floor_us'] / r['ours_us']:.0f}%",
            f"{r['err_vs_ref']:.2g}" + (" [red]DISAGREES" if r["err_vs_ref"] > AGREE_ATOL else ""),
            f"{r['ref_chunked_us']:.0f}" if "ref_chunked_us" in r else "-",
            fla_cell("fla_recurrent"),
            fla_cell("fla_chunk"),
        )
    console.print(table)
    console.print(
        "step: conv + the rule as a step runs it (decodes recurrent, prefills chunked), err vs "
        "gdn_ref; decodes timed in a CUDA graph; fla per call with host launch, from states "
        "gathered by slot beforehand (an engine would also gather and scatter them)"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(bandwidth=hw.bandwidth, rows=rows), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
