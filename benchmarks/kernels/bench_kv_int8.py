"""INT8 KV cache on a GPU: decode-attention kernel time bf16 vs int8, and logit drift with
position on a random-weight model.

    python -m benchmarks.kernels.bench_kv_int8 [--out FILE.json] [--model qwen3-0.6b]
        [--contexts 1024,2048,4096,8192,16384,32768] [--batch 1,16] [--drift-len 16384]

1. Kernel: decode_attention over a paged cache in the Llama-3-8B attention shape (32 query
   heads, 8 KV heads, head_dim 128), one call per (batch, context), timed with CUDA events
   (triton.testing.do_bench). Floor = KV bytes read / copy bandwidth measured in this run
   (bandwidth counts read + written bytes, as the rest of the benchmarks do; a kernel that only
   reads can beat it somewhat). int8 reads half the bytes plus 2 scale bytes per 128.
2. Drift: the same random-weight model (profiles/models/<model>, load_format="random", seed
   0) in two engines, bf16 and int8 KV; one random token sequence teacher-forced through both
   (engine.runner.scoring); KL(bf16 || int8) and top-1 agreement of next-token distributions, by
   position bucket. Drift shows as KL growing with position.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.floor import measure_hardware
from benchmarks.presets import materialise_preset
from engine import LLM
from engine.kernels.decode_attention import decode_attention
from engine.kernels.torch_ref import KV_SCALE_DTYPE
from engine.runner.scoring import iter_next_token_logprobs

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def _time_decode(q, k, v, tables, lens, ctx: int, scales: dict) -> float:
    """Milliseconds per decode_attention call (max_seq_len given: no host sync per call)."""
    from triton.testing import do_bench

    scale = HEAD_DIM**-0.5
    return do_bench(
        lambda: decode_attention(q, k, v, tables, lens, scale, max_seq_len=ctx, **scales),
        warmup=10,
        rep=50,
    )


def kernel_times(contexts: list[int], batches: list[int], bandwidth: float) -> list[dict]:
    rows = []
    for batch in batches:
        for ctx in contexts:
            blocks = batch * ctx // BLOCK
            tables = torch.arange(blocks, dtype=torch.int32, device="cuda").view(batch, -1)
            lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
            q = torch.randn(batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            shape = (blocks, BLOCK, KV_HEADS, HEAD_DIM)
            row = {"batch": batch, "context": ctx}
            for kind in ("bf16", "int8"):
                if kind == "bf16":
                    k = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
                    v, scales, row_bytes = torch.randn_like(k), {}, 2 * HEAD_DIM
                else:
                    k = torch.randint(-127, 128, shape, dtype=torch.int8, device="cuda")
                    v = torch.randint_like(k, -127, 128)
                    s = torch.rand(shape[:3], device="cuda").to(KV_SCALE_DTYPE) * 0.05
                    scales, row_bytes = {"k_scales": s, "v_scales": s.clone()}, HEAD_DIM + 2
                ms = _time_decode(q, k, v, tables, lens, ctx, scales)
                kv_bytes = 2 * batch * ctx * KV_HEADS * row_bytes
                row[f"{kind}_us"] = ms * 1e3
                row[f"{kind}_floor_us"] = kv_bytes / bandwidth * 1e6
                del k, v, scales
            row["speedup"] = row["bf16_us"] / row["int8_us"]
            rows.append(row)
            print(
                f"batch {batch:3d} ctx {ctx:6d}: bf16 {row['bf16_us']:8.1f} us "
                f"(floor {row['bf16_floor_us']:7.1f})  int8 {row['int8_us']:8.1f} us "
                f"(floor {row['int8_floor_us']:7.1f})  speedup {row['speedup']:.2f}x"
            )
            torch.cuda.empty_cache()
    return rows


def drift(model: str, length: int, bucket: int, device="cuda", tiny=False) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-kv-int8-") as tmp:
        folder = materialise_preset(model, tmp, tiny)
        common = dict(
            load_format="random",
            seed=0,
            max_model_len=length + 16,
            max_num_seqs=1,
            num_kv_blocks=-(-(length + 16) // BLOCK),
            enforce_eager=True,
        )
        dtype = "bfloat16" if device == "cuda" else "float32"
        a = LLM(str(folder), device=device, dtype=dtype, **common)
        b = LLM(str(folder), device=device, dtype=dtype, kv_cache_dtype="int8", **common)
        vocab = a.engine.model_config.vocab_size
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (length,), generator=gen).tolist()
        kls, agree = [], []
        pairs = zip(
            iter_next_token_logprobs(a.engine, ids, 1024),
            iter_next_token_logprobs(b.engine, ids, 1024),
        )
        for (_, lp), (_, lq) in pairs:
            kls.append((lp.exp() * (lp - lq)).sum(1).float().cpu())  # [m]
            agree.append((lp.argmax(1) == lq.argmax(1)).float().cpu())
        kl, top1 = torch.cat(kls), torch.cat(agree)
    rows = []
    for lo in range(0, kl.shape[0], bucket):
        row = {
            "start": lo,
            "end": min(lo + bucket, kl.shape[0]),
            "mean_kl": float(kl[lo : lo + bucket].mean()),
            "top1_agreement": float(top1[lo : lo + bucket].mean()),
        }
        rows.append(row)
        print(
            f"positions {row['start']:6d}-{row['end']:6d}: KL {row['mean_kl']:.3e} nats, "
            f"top-1 agreement {row['top1_agreement']:.3f}"
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--batch", default="1,16")
    p.add_argument("--model", default="qwen3-0.6b", help="profiles/models preset for drift")
    p.add_argument("--drift-len", type=int, default=16384)
    p.add_argument("--bucket", type=int, default=2048)
    p.add_argument("--out", help="write the results as JSON")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_kv_int8: needs a CUDA GPU", file=sys.stderr)
        return 2
    hw = measure_hardware(torch.device("cuda"), torch.bfloat16)
    print(f"copy bandwidth {hw.bandwidth / 1e12:.2f} TB/s (read + write)")
    contexts = [int(x) for x in a.contexts.split(",")]
    batches = [int(x) for x in a.batch.split(",")]
    result = {"bandwidth": hw.bandwidth, "kernel": kernel_times(contexts, batches, hw.bandwidth)}
    result["drift"] = drift(a.model, a.drift_len, a.bucket)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
