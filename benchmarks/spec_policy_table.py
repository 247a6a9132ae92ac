"""The adaptive speculative policy's choices on a measured cost table: starts an engine with
speculative="ngram" (which measures the step costs at start-up, engine/spec/measure.py),
prints the table, then for each acceptance rate a and batch size b the k the policy chooses
for b requests at that rate (their drafter's rate; no probe) and its expected speed-up.

    .venv/bin/python -m benchmarks.spec_policy_table [--model PATH] [--device cpu]
        [--rates 0.3,0.6,0.9] [--batches 1,8,16,64] [LLM settings as --name value ...]
"""

from __future__ import annotations

import argparse

from engine import LLM
from engine.spec.draft_length import SpecPolicy


def decisions(costs, rates: list[float], batches: list[int]) -> list[tuple[float, int, int, float]]:
    """(a, b, k chosen, expected speed-up over k = 0) for each rate and batch size."""
    rows = []
    for a in rates:
        for b in batches:
            policy = SpecPolicy(costs, probe_rate=0.0)
            drafter = policy._drafter("ngram")
            drafter.accepted, drafter.checked = a * 1e6, 1e6  # a rate measured long enough
            d = policy.choose([f"r{i}" for i in range(b)], "ngram")
            rows.append((a, b, d.k, d.tokens_per_s / d.tokens_per_s_off))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rates", default="0.3,0.6,0.9")
    ap.add_argument("--batches", default="1,8,16,64")
    args, extra = ap.parse_known_args()
    settings = {k.lstrip("-").replace("-", "_"): v for k, v in zip(extra[::2], extra[1::2])}
    settings = {k: int(v) if v.isdigit() else v for k, v in settings.items()}
    llm = LLM(args.model, device=args.device, speculative="ngram", **settings)
    costs = llm.engine.spec.policy.costs
    print(f"start-up: {llm.engine.startup_s}")
    for (b, k), s in sorted(costs.entries().items()):
        print(f"cost b={b:3d} k={k}: {s * 1e3:8.2f} ms")
    rates = [float(r) for r in args.rates.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    for a, b, k, gain in decisions(costs, rates, batches):
        print(f"a={a:.1f} b={b:3d}: k={k} ({gain:.2f}x expected)")


if __name__ == "__main__":
    main()
