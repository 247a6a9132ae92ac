"""End-to-end speed of n-gram speculative decoding in the engine: the embedded
SmolLM2-135M-Instruct answers prompts of benchmarks/spec_prompts.jsonl greedily, one request at a
time (batch 1), with speculation off and with speculative="ngram" (or draft:PATH) at each k
given (auto: the adaptive k, after its start-up measurement; off: plain again); prints the
output tokens per second of each run, the speed-up over off, the acceptance rate and mean
accepted length, and checks that every answer is the same token for token.

    .venv/bin/python scripts/bench_spec_engine.py [--kinds edit,grounded] [--per-kind 2]
        [--max-tokens 96] [--ks 4,8,auto] [--speculative ngram|draft:PATH] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from engine import LLM, SamplingParams

PROMPTS_FILE = Path(__file__).with_name("spec_prompts.jsonl")


def _prompts(kinds: list[str], per_kind: int) -> list[list[dict]]:
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    chosen = []
    for kind in kinds:
        chosen += [r["prompt"] for r in rows if r["kind"] == kind][:per_kind]
    return [[{"role": "user", "content": p}] for p in chosen]


def _run(llm: LLM, chats: list[list[dict]], params: SamplingParams) -> tuple[list, float]:
    """Each chat alone (batch 1): the answers and the seconds of generation in all."""
    outs, seconds = [], 0.0
    for chat in chats:
        start = time.perf_counter()
        outs += llm.chat([chat], params)
        seconds += time.perf_counter() - start
    return outs, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="edit,summarise,grounded,chat")
    ap.add_argument("--per-kind", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ks", default="4,8", help="k values; auto: adaptive; off: plain again")
    ap.add_argument("--speculative", default="ngram", help="ngram or draft:PATH")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    chats = _prompts(args.kinds.split(","), args.per_kind)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    off, off_s = _run(LLM(device=args.device), chats, params)
    tokens = sum(len(o.token_ids) for o in off)
    print(f"off: {tokens} tokens in {off_s:.1f} s, {tokens / off_s:.1f} tok/s")
    for name in args.ks.split(","):
        if name == "off":  # again, to see how much the machine's speed moved meanwhile
            again, again_s = _run(LLM(device=args.device), chats, params)
            print(f"off again: {tokens / again_s:.1f} tok/s, {off_s / again_s:.2f}x")
            continue
        k = None if name == "auto" else int(name)
        llm = LLM(device=args.device, speculative=args.speculative, num_speculative_tokens=k)
        on, on_s = _run(llm, chats, params)
        same = [a.token_ids == b.token_ids for a, b in zip(off, on)]
        spec = llm.engine.stats()["spec_decode"]
        print(
            f"{args.speculative} k={name}: {tokens / on_s:.1f} tok/s, {off_s / on_s:.2f}x; "
            f"acceptance "
            f"{spec['acceptance_rate']:.2f}, mean accepted length "
            f"{spec['mean_accepted_length']:.2f}; answers identical: {sum(same)}/{len(same)}"
        )


if __name__ == "__main__":
    main()
