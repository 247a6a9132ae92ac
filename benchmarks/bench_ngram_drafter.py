"""Cost of one n-gram drafting step on the CPU: a request of N tokens gets one more token and
asks for k drafts, as it would every decode step. Prints microseconds per call, against the
cost of the naive alternative (scanning the whole sequence for the suffix every step).

    .venv/bin/python -m benchmarks.bench_ngram_drafter [--tokens 8192] [--k 8] [--calls 2000]
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, field

from engine.spec.ngram import DEFAULT_MAX_N, DEFAULT_MIN_N, NgramDrafter


@dataclass
class _Req:
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    num_pending: int = 0


def text_like(num_tokens: int, vocab: int, rng: random.Random) -> list[int]:
    """Random tokens with copied spans, so that lookups hit as they do on grounded text."""
    tokens: list[int] = []
    while len(tokens) < num_tokens:
        if len(tokens) > 64 and rng.random() < 0.3:
            start = rng.randrange(len(tokens) - 32)
            tokens += tokens[start : start + rng.randint(4, 32)]
        else:
            tokens += [rng.randrange(vocab) for _ in range(rng.randint(4, 32))]
    return tokens[:num_tokens]


def naive_lookup(tokens: list[int], k: int) -> list[int]:
    """The quadratic way: scan backwards for the suffix on every call."""
    length = len(tokens)
    for n in range(DEFAULT_MAX_N, DEFAULT_MIN_N - 1, -1):
        suffix = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    rng = random.Random(0)
    stream = text_like(args.tokens + args.calls, 49152, rng)
    req = _Req("r", stream[: args.tokens])
    drafter = NgramDrafter()
    start = time.perf_counter()
    drafter.propose([req], args.k)
    first = time.perf_counter() - start
    hits = 0
    start = time.perf_counter()
    for token in stream[args.tokens :]:
        req.token_ids.append(token)
        hits += bool(drafter.propose([req], args.k)[0].token_ids)
    per_call = (time.perf_counter() - start) / args.calls
    naive_calls = max(args.calls // 20, 1)
    start = time.perf_counter()
    for _ in range(naive_calls):
        naive_lookup(req.token_ids, args.k)
    naive = (time.perf_counter() - start) / naive_calls
    print(f"sequence {args.tokens} tokens, k={args.k}, {args.calls} calls ({hits} with a draft)")
    print(f"first call (indexes the whole sequence): {first * 1e3:.2f} ms")
    print(f"per call, incremental index:             {per_call * 1e6:.1f} us")
    print(f"per call, naive backward scan (floor it avoids): {naive * 1e6:.1f} us")


if __name__ == "__main__":
    main()
