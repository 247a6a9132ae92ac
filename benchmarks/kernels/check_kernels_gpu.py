"""GPU check of the Triton attention kernels against the PyTorch reference on real model shapes,
then a decode-attention benchmark: KV bytes read per second against the copy bandwidth.

Run on the GPU machine from the source tree: `python -m benchmarks.kernels.check_kernels_gpu`.
Exit status 1 if any correctness check fails.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from rich.console import Console
from rich.table import Table

from engine.kernels.decode_attention import decode_attention, decode_workspace, default_num_splits
from engine.kernels.prefill_attention import prefill_attention
from engine.kernels.store_kv import store_kv
from engine.kernels.torch_ref import decode_attention_ref, prefill_attention_ref, store_kv_ref

MODELS = {"Llama-3-8B": (32, 8, 128), "Qwen3-0.6B": (16, 8, 128)}  # heads, kv heads, head_dim
BLOCK_SIZE = 16
DTYPE = torch.bfloat16
ATOL = 3e-2  # bf16 output vs an fp32 reference
L2_FLUSH_BYTES = 512 << 20  # benchmark over enough "layers" that the KV is not L2-resident
console = Console()


def paged_kv(seq_lens, num_kv_heads, head_dim, num_layers=1, gen=None):
    """Random all-layer KV [layers, 2, blocks, block_size, kvh, hd] and permuted tables."""
    blocks = [math.ceil(n / BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(blocks) + 1
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks) + 1, dtype=torch.int32)
    for i, b in enumerate(blocks):
        tables[i, :b] = torch.tensor(perm[:b], dtype=torch.int32)
        perm = perm[b:]
    kv = torch.randn(
        num_layers, 2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, device="cuda", dtype=DTYPE
    )
    return kv, tables.cuda()


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def check_model(name: str, num_heads: int, num_kv_heads: int, head_dim: int) -> list[tuple]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    scale = head_dim**-0.5
    # store_kv: a padded batch (slot -1) into a fresh cache.
    kv, _ = paged_kv([4096], num_kv_heads, head_dim)
    k_cache, v_cache = kv[0, 0], kv[0, 1]
    slots = torch.randperm(4096, device="cuda")[:300]
    slots[-20:] = -1
    k = torch.randn(300, num_kv_heads, head_dim, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    store_kv_ref(k[:-20], v[:-20], ref_k, ref_v, slots[:-20])
    store_kv(k, v, k_cache, v_cache, slots)
    same = torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    rows.append((name, "store_kv", "300 tok, 20 padded", 0.0 if same else math.inf))
    # decode: ragged batch with padding rows, heuristic and fixed splits.
    seq_lens = torch.randint(1, 4097, (60,), generator=gen).tolist() + [0, 1, 16, 4096]
    kv, tables = paged_kv([max(n, 1) for n in seq_lens], num_kv_heads, head_dim, gen=gen)
    k_cache, v_cache = kv[0, 0], kv[0, 1]
    lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(seq_lens), num_heads, head_dim, device="cuda", dtype=DTYPE)
    live = lens > 0
    ref = decode_attention_ref(
        q[live].float(), k_cache.float(), v_cache.float(), tables[live], lens[live], scale
    )
    for splits in (None, 1, 8, 32):
        out = decode_attention(q, k_cache, v_cache, tables, lens, scale, num_splits=splits)
        e = max(err(out[live], ref), out[~live].abs().max().item())
        rows.append((name, "decode", f"64 seqs <=4096, splits={splits}", e))
    # prefill: fresh prompts and chunks after a cached prefix.
    chunks = [(1024, 1024), (4096, 4096), (512, 2048), (1, 300), (77, 77), (300, 1500)]
    kv, tables = paged_kv([s for _, s in chunks], num_kv_heads, head_dim, gen=gen)
    starts = [0]
    for n, _ in chunks:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1], num_heads, head_dim, device="cuda", dtype=DTYPE)
    out = prefill_attention(
        q,
        kv[0, 0],
        kv[0, 1],
        tables,
        torch.tensor(starts, dtype=torch.int32, device="cuda"),
        torch.tensor([s for _, s in chunks], dtype=torch.int32, device="cuda"),
        max(n for n, _ in chunks),
        scale,
    )
    ref = prefill_attention_ref(
        q.float(), kv[0, 0].float(), kv[0, 1].float(), tables, starts, [s for _, s in chunks], scale
    )
    rows.append((name, "prefill", "6 chunks, prefix/no prefix", err(out, ref)))
    return rows


def time_cuda(fn, iters: int = 20) -> float:
    """Median seconds per fn() call, CUDA events, after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth() -> float:
    """Device copy rate, counting read + write bytes (as benchmarks/floor.py does). A read-only
    stream such as decode attention can slightly exceed it."""
    src = torch.randn(1 << 30, device="cuda", dtype=DTYPE)  # 2 GiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / time_cuda(lambda: dst.copy_(src))


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=DTYPE)
    b = torch.randn(8192, 8192, device="cuda", dtype=DTYPE)
    return 2 * 8192**3 / time_cuda(lambda: a @ b)


def bench_decode(
    num_heads, num_kv_heads, head_dim, batch, ctx, num_splits=None
) -> tuple[int, float, float]:
    """(num_splits, eager s/call, CUDA-graph s/call), cycling over enough layers' caches that
    each call reads its KV from HBM, as a real model's layers do. num_splits None: the
    wrapper's heuristic."""
    kv_bytes = 2 * batch * ctx * num_kv_heads * head_dim * DTYPE.itemsize
    num_layers = max(2, math.ceil(L2_FLUSH_BYTES / kv_bytes))
    kv, tables = paged_kv([ctx] * batch, num_kv_heads, head_dim, num_layers)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(num_layers, batch, num_heads, head_dim, device="cuda", dtype=DTYPE)
    out = torch.empty_like(q[0])
    splits = num_splits or default_num_splits(batch, num_kv_heads, ctx, q.device)
    ws = decode_workspace(batch, num_heads, head_dim, splits, "cuda") if splits > 1 else None

    def all_layers():
        for i in range(num_layers):
            decode_attention(
                q[i],
                kv[i, 0],
                kv[i, 1],
                tables,
                lens,
                head_dim**-0.5,
                num_splits=splits,
                workspace=ws,
                out=out,
            )

    eager = time_cuda(all_layers) / num_layers
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        all_layers()  # warm-up (compiles) outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        all_layers()
    graphed = time_cuda(graph.replay) / num_layers
    return splits, eager, graphed


def bench_prefill(num_heads, num_kv_heads, head_dim, prompt_len) -> float:
    """Seconds for one fresh prompt's prefill attention (one layer)."""
    kv, tables = paged_kv([prompt_len], num_kv_heads, head_dim)
    q = torch.randn(prompt_len, num_heads, head_dim, device="cuda", dtype=DTYPE)
    starts = torch.tensor([0, prompt_len], dtype=torch.int32, device="cuda")
    lens = starts[1:].clone()
    return time_cuda(
        lambda: prefill_attention(
            q, kv[0, 0], kv[0, 1], tables, starts, lens, prompt_len, head_dim**-0.5
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="contexts 512 and 4096 only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        console.print("no CUDA device: this script runs on the GPU machine")
        return 2
    console.print(f"device: {torch.cuda.get_device_name()}")
    checks = Table(title="kernels vs torch_ref (bf16, fp32 reference)")
    for col in ("model", "kernel", "case", "max abs err", "ok"):
        checks.add_column(col)
    ok = True
    for name, shape in MODELS.items():
        for model, kernel, case, e in check_model(name, *shape):
            ok &= e <= ATOL
            checks.add_row(model, kernel, case, f"{e:.2e}", "yes" if e <= ATOL else "FAIL")
    console.print(checks)

    bandwidth, flops = copy_bandwidth(), matmul_rate()
    bench = Table(
        title=f"decode attention: KV read rate vs copy {bandwidth / 1e12:.2f} TB/s "
        f"(bf16 matmul {flops / 1e12:.0f} TFLOP/s)"
    )
    for col in (
        "model",
        "batch",
        "ctx",
        "splits",
        "KV MB",
        "eager us",
        "graph us",
        "graph TB/s",
        "% of copy",
    ):
        bench.add_column(col, justify="right")
    contexts = (512, 4096) if args.quick else (512, 1024, 2048, 4096)
    for name, (num_heads, num_kv_heads, head_dim) in MODELS.items():
        for batch in (1, 64, 256):
            for ctx in contexts:
                splits, eager, graphed = bench_decode(num_heads, num_kv_heads, head_dim, batch, ctx)
                kv_bytes = 2 * batch * ctx * num_kv_heads * head_dim * DTYPE.itemsize
                bench.add_row(
                    name,
                    str(batch),
                    str(ctx),
                    str(splits),
                    f"{kv_bytes / 1e6:.1f}",
                    f"{eager * 1e6:.1f}",
                    f"{graphed * 1e6:.1f}",
                    f"{kv_bytes / graphed / 1e12:.2f}",
                    f"{100 * kv_bytes / graphed / bandwidth:.0f}%",
                )
    console.print(bench)
    prefill = Table(title="prefill attention, one fresh prompt, one layer (causal FLOPs)")
    for col in ("model", "prompt", "us", "TFLOP/s", "% of matmul"):
        prefill.add_column(col, justify="right")
    for name, (num_heads, num_kv_heads, head_dim) in MODELS.items():
        for n in (1024, 4096):
            t = bench_prefill(num_heads, num_kv_heads, head_dim, n)
            rate = 4 * num_heads * head_dim * n * (n + 1) / 2 / t  # QK^T and PV, causal half
            prefill.add_row(
                name, str(n), f"{t * 1e6:.0f}", f"{rate / 1e12:.0f}", f"{100 * rate / flops:.0f}%"
            )
    console.print(prefill)
    console.print("correctness: " + ("all passed" if ok else "FAILURES (see table)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
