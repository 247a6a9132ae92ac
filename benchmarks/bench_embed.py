"""Embedding throughput of the engine (LLM.embed) against its prefill floor, and against
transformers' own model on the same inputs.

On a GPU, the goal (engine >= 0.80 of the floor) is measured on Qwen3-Embedding-0.6B's shape
with random weights in bfloat16, 512-token inputs:

    python3 -m benchmarks.bench_embed --arch qwen3-0.6b --device cuda --dtype bfloat16 \
        --len 512 --num 2048

That shape's engine loads random weights from its config alone (load_format="random"), so the
transformers comparison is skipped there: the floor is the goal. On the CPU (the defaults), the
small shapes compare with transformers too:

    python3 -m benchmarks.bench_embed [--arch bert|qwen3|qwen3-0.6b] [--num 256] [--len 64]
        [--device cpu] [--dtype float32] [--tiny]

Architectures (ARCHS): an all-MiniLM-L6-v2-shaped BERT (mean pooling), a small Qwen3-shaped
decoder and Qwen3-Embedding-0.6B's shape (both last-token pooling); --tiny gives any of them
benchmarks.presets.TINY_DIMS (a quick CPU run of the same code path). The prefill floor is
benchmarks.embed_floor's: the inputs' FLOPs over the matmul rate measured in the same run.
transformers runs batches of --batch inputs of one length (no padding costs), pooled and
normalised the same way. Prints inputs per second of each and the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModel, BertConfig, BertTokenizerFast, PretrainedConfig, Qwen3Config

from appliance import model_presets
from benchmarks import embed_floor
from benchmarks.op_profile import top_ops
from benchmarks.presets import TINY_DIMS
from engine import LLM

VOCAB = 1000
"""The vocabulary of the shapes saved with weights and a tokenizer."""
GOAL = 0.80
"""The engine's share of the prefill floor the GPU goal asks for."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def qwen3_embedding_0_6b() -> dict:
    """Qwen3-Embedding-0.6B's config values: Qwen3-0.6B's layers (the preset) with its own
    vocabulary and context length."""
    preset = model_presets.load_preset("qwen3-0.6b")
    return {**preset, "vocab_size": 151669, "max_position_embeddings": 32768}


@dataclass(frozen=True)
class Arch:
    """One benchmarked shape."""

    config_class: type[PretrainedConfig]
    dims: Callable[[], dict]
    """The config's values."""
    pooling: str
    """1_Pooling/config.json's key."""
    causal: bool
    saved: bool
    """True: transformers' random weights are saved for both (the comparison runs); False: the
    engine makes its own random weights from config.json (no comparison)."""


ARCHS = {
    "bert": Arch(  # all-MiniLM-L6-v2's shape
        BertConfig,
        lambda: dict(
            vocab_size=VOCAB,
            hidden_size=384,
            num_hidden_layers=6,
            num_attention_heads=12,
            intermediate_size=1536,
            max_position_embeddings=512,
        ),  # fmt: skip
        "pooling_mode_mean_tokens",
        causal=False,
        saved=True,
    ),
    "qwen3": Arch(
        Qwen3Config,
        lambda: dict(
            vocab_size=VOCAB,
            hidden_size=512,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            intermediate_size=1536,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
        ),  # fmt: skip
        "pooling_mode_lasttoken",
        causal=True,
        saved=True,
    ),
    "qwen3-0.6b": Arch(
        Qwen3Config, qwen3_embedding_0_6b, "pooling_mode_lasttoken", causal=True, saved=False
    ),
}


def arch_config(arch: str, tiny: bool = False) -> PretrainedConfig:
    """ARCHS[arch]'s config; `tiny`: with TINY_DIMS' layers (its own vocabulary kept: the saved
    shapes' tokenizer has VOCAB words)."""
    dims = ARCHS[arch].dims()
    if tiny:
        dims.update({k: v for k, v in TINY_DIMS.items() if k != "vocab_size"})
    return ARCHS[arch].config_class(**dims)


def build(arch: str, cfg: PretrainedConfig, folder: Path) -> None:
    """A model folder of `arch` the engine can load: with a saved shape, random weights and a
    tokenizer; otherwise config.json alone (load_format="random"). Decoders are named the causal
    LM Qwen3-Embedding's config names."""
    torch.manual_seed(0)
    folder.mkdir(parents=True)
    if ARCHS[arch].saved:
        AutoModel.from_config(cfg).save_pretrained(folder)
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]
        BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}).save_pretrained(folder)
    else:
        (folder / "config.json").write_text(cfg.to_json_string())
    if ARCHS[arch].causal:
        config = json.loads((folder / "config.json").read_text())
        config["architectures"] = ["Qwen3ForCausalLM"]
        (folder / "config.json").write_text(json.dumps(config))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({ARCHS[arch].pooling: True}))


def reference(
    folder: Path, arch: str, inputs: list[list[int]], batch: int, device: str, dtype: torch.dtype
) -> tuple[float, list[list[float]]]:
    """Seconds transformers takes for the inputs, in batches of `batch`, and its vectors."""
    model = AutoModel.from_pretrained(folder, dtype=dtype).to(device).eval()
    vectors = []
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(inputs), batch):
            ids = torch.tensor(inputs[i : i + batch], device=device)
            hidden = model(ids).last_hidden_state  # [batch, len, hidden]
            pooled = hidden.mean(1) if not ARCHS[arch].causal else hidden[:, -1]
            vectors += F.normalize(pooled.float(), dim=-1).tolist()
    return time.perf_counter() - start, vectors


@dataclass(frozen=True)
class EmbedRun:
    """What one run measured."""

    engine_s: float
    """Seconds of LLM.embed over every input (after a first, unmeasured call)."""
    floor_s: float
    """The inputs' FLOPs over the measured rate."""
    flops: float
    rate: embed_floor.MatmulRate
    reference_s: float | None = None
    """transformers' seconds (None: not compared)."""
    max_diff: float | None = None
    """Largest |engine - transformers| over the vectors' elements."""


def measure(
    arch: str,
    num: int,
    length: int,
    batch: int,
    device: str,
    dtype: str,
    tiny: bool = False,
    step_tokens: int | None = None,
    profile: int = 0,
) -> EmbedRun:
    """Embed `num` seeded inputs of `length` tokens with the engine, measure the floor, and
    (for a saved shape) transformers."""
    cfg = arch_config(arch, tiny)
    vocab = VOCAB if ARCHS[arch].saved else cfg.vocab_size
    rng = random.Random(0)
    inputs = [[rng.randrange(5, vocab) for _ in range(length)] for _ in range(num)]
    torch_dtype = DTYPES[dtype]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"bench-{arch}-embedding"
        build(arch, cfg, folder)
        load_format = "auto" if ARCHS[arch].saved else "random"
        llm = LLM(
            str(folder),
            device=device,
            dtype=dtype,
            prefix_caching=False,
            load_format=load_format,
            max_num_batched_tokens=step_tokens,
        )
        # the engine's prefill step: its planned token budget, at most every input's tokens
        step_tokens = min(llm.engine.config.max_num_batched_tokens or num * length, num * length)
        llm.embed(inputs[: max(4, step_tokens // length)])  # first call: one full step, unmeasured
        if profile:
            one_step = inputs[: max(1, step_tokens // length)]
            lines = top_ops(partial(llm.embed, one_step), profile, device)
            print("\n".join(["one full step under the profiler:", *lines]))
        start = time.perf_counter()
        got = llm.embed(inputs)
        engine_s = time.perf_counter() - start
        del llm  # its KV pool: the GEMM and transformers need the memory
        gc.collect()
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        shape = embed_floor.model_shape(cfg)
        flops = embed_floor.embed_flops(shape, num, length, ARCHS[arch].causal)
        k, n = cfg.hidden_size, cfg.intermediate_size
        rate = embed_floor.prefill_matmul_rate(device, torch_dtype, step_tokens, k, n)
        run = EmbedRun(engine_s, flops / rate.flops, flops, rate)
        if not ARCHS[arch].saved:
            return run
        reference(folder, arch, inputs[:batch], batch, device, torch_dtype)  # warm
        ref_s, want = reference(folder, arch, inputs, batch, device, torch_dtype)
    diff = (torch.tensor(got) - torch.tensor(want)).abs().max().item()
    return EmbedRun(engine_s, run.floor_s, flops, rate, ref_s, diff)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=tuple(ARCHS), default="bert")
    parser.add_argument("--num", type=int, default=256, help="inputs")
    parser.add_argument("--len", type=int, default=64, help="tokens per input")
    parser.add_argument("--batch", type=int, default=32, help="transformers' batch size")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--tiny", action="store_true", help="the shape with tiny dimensions")
    parser.add_argument(
        "--step-tokens", type=int, default=None, help="the engine's step budget (default planned)"
    )
    parser.add_argument("--profile", type=int, default=0, help="profile one step: its top N ops")
    args = parser.parse_args(argv)
    run = measure(
        args.arch, args.num, args.len, args.batch, args.device, args.dtype, args.tiny,
        args.step_tokens, args.profile,
    )  # fmt: skip
    tiny = " (tiny)" if args.tiny else ""
    shape = f"{args.num} inputs x {args.len} tokens, {args.arch}{tiny}, {args.device}, {args.dtype}"
    ours = args.num / run.engine_s
    print(f"engine LLM.embed: {ours:.1f} inputs/s ({shape})")
    if run.reference_s is None:
        print("transformers: skipped (random weights made by the engine; the floor is the goal)")
    else:
        print(f"transformers batch {args.batch}: {args.num / run.reference_s:.1f} inputs/s")
        ratio = run.reference_s / run.engine_s
        print(f"ratio engine / transformers: {ratio:.2f}; max |difference| {run.max_diff:.1e}")
    print(
        f"prefill floor: {run.flops / args.num / 1e9:.4g} GFLOP per input at "
        f"{run.rate.flops / 1e12:.4g} TFLOP/s ({run.rate.describe()}, best of 5): "
        f"{args.num / run.floor_s:.1f} inputs/s"
    )
    print(f"ratio engine / prefill floor: {run.floor_s / run.engine_s:.2f} (goal >= {GOAL:.2f})")


if __name__ == "__main__":
    main()
