"""Embedding throughput of the engine (LLM.embed) against transformers' own model on the same
inputs, on random weights of an all-MiniLM-L6-v2-shaped BERT (mean pooling) or a small
Qwen3-shaped decoder (last-token pooling):

    python3 -m benchmarks.bench_embed [--arch bert|qwen3] [--num 256] [--len 64] [--device cpu]

The floor is transformers: the same model, batches of --batch inputs of one length (no padding
costs), pooled and normalised the same way. Prints inputs per second of each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModel, BertConfig, BertTokenizerFast, Qwen3Config

from engine import LLM

VOCAB = 1000


def build(arch: str, folder: Path) -> None:
    """A random-weight model of `arch`, saved with a tokenizer the engine can load."""
    torch.manual_seed(0)
    if arch == "bert":  # all-MiniLM-L6-v2's shape
        cfg = BertConfig(
            vocab_size=VOCAB, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
            intermediate_size=1536, max_position_embeddings=512,
        )  # fmt: skip
        pooling = {"pooling_mode_mean_tokens": True}
    else:
        cfg = Qwen3Config(
            vocab_size=VOCAB, hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
            num_key_value_heads=4, head_dim=64, intermediate_size=1536,
            max_position_embeddings=2048, tie_word_embeddings=True,
        )  # fmt: skip
        pooling = {"pooling_mode_lasttoken": True}
    AutoModel.from_config(cfg).save_pretrained(folder)
    if arch == "qwen3":  # the engine loads it as the causal LM Qwen3-Embedding's config names
        config = json.loads((folder / "config.json").read_text())
        config["architectures"] = ["Qwen3ForCausalLM"]
        (folder / "config.json").write_text(json.dumps(config))
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]
    BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}).save_pretrained(folder)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def reference(
    folder: Path, arch: str, inputs: list[list[int]], batch: int, device: str
) -> tuple[float, list[list[float]]]:
    """Seconds transformers takes for the inputs, in batches of `batch`, and its vectors."""
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    vectors = []
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(inputs), batch):
            ids = torch.tensor(inputs[i : i + batch], device=device)
            hidden = model(ids).last_hidden_state  # [batch, len, hidden]
            pooled = hidden.mean(1) if arch == "bert" else hidden[:, -1]
            vectors += F.normalize(pooled, dim=-1).tolist()
    return time.perf_counter() - start, vectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=("bert", "qwen3"), default="bert")
    parser.add_argument("--num", type=int, default=256, help="inputs")
    parser.add_argument("--len", type=int, default=64, help="tokens per input")
    parser.add_argument("--batch", type=int, default=32, help="transformers' batch size")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    rng = random.Random(0)
    inputs = [[rng.randrange(5, VOCAB) for _ in range(args.len)] for _ in range(args.num)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"bench-{args.arch}-embedding"
        build(args.arch, folder)
        llm = LLM(str(folder), device=args.device, dtype="float32", prefix_caching=False)
        llm.embed(inputs[:4])  # first call, unmeasured
        start = time.perf_counter()
        got = llm.embed(inputs)
        ours = time.perf_counter() - start
        reference(folder, args.arch, inputs[: args.batch], args.batch, args.device)  # warm
        floor, want = reference(folder, args.arch, inputs, args.batch, args.device)
    diff = (torch.tensor(got) - torch.tensor(want)).abs().max().item()
    shape = f"{args.num} inputs x {args.len} tokens, {args.arch}, {args.device}, fp32"
    print(f"engine LLM.embed: {args.num / ours:.1f} inputs/s ({shape})")
    print(f"floor, transformers batch {args.batch}: {args.num / floor:.1f} inputs/s")
    print(f"ratio engine / transformers: {floor / ours:.2f}; max |difference| {diff:.1e}")


if __name__ == "__main__":
    main()
