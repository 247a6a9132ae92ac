"""Offline generation demo on the embedded default model (or --model): a few chat prompts,
batched, with the time each took and the overall output tokens/s."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import LLM, SamplingParams  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about a GPU.",
    "Explain what a KV cache is in one sentence.",
    "List three prime numbers.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="HF folder or .gguf (default: embedded)")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    start = time.perf_counter()
    llm = LLM(args.model)
    print(
        f"loaded {llm.engine.model_name} on {llm.engine.device} "
        f"in {time.perf_counter() - start:.1f}s"
    )
    convos = [[{"role": "user", "content": q}] for q in QUESTIONS]
    start = time.perf_counter()
    outs = llm.chat(convos, SamplingParams(max_tokens=args.max_tokens, temperature=0.0))
    elapsed = time.perf_counter() - start
    for q, out in zip(QUESTIONS, outs):
        m = out.metrics
        print(
            f"\n> {q}\n{out.text.strip()}\n[{len(out.token_ids)} tokens, "
            f"{out.finish_reason}, first token after {m.first_token_time - m.arrival_time:.2f}s]"
        )
    total = sum(len(o.token_ids) for o in outs)
    print(f"\n{total} tokens in {elapsed:.1f}s: {total / elapsed:.1f} tok/s")


if __name__ == "__main__":
    main()
