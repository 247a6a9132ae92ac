"""Speculative decoding's cost and speed with random weights in a real shape (default
llama-3-8b; token-id prompts), one engine for every part:

1. **cost**: the verify step's seconds by (batch, k), engine/spec/measure.py's table (batch
   1, 4, 16, 64 where the pool holds them; k 0-8; k = 0 the plain decode step).
2. **forced acceptance**: batch-1 tokens per second with drafts that agree with the target's
   greedy token with probability a (`ForcedDrafter`: the plain run's own tokens, each replaced
   by another with probability 1 - a, so acceptance runs until the first replaced one), at each
   k, against speculation off (k = 0: CUDA graphs and overlapped steps, as without it).
3. **load**: `--concurrent` requests at once, the adaptive k (n-gram drafts, the measured
   table) against speculation off.

Every speculative run's tokens are checked against the plain run's (greedy: identical).

    python3 -m benchmarks.bench_spec_gpu [--model llama-3-8b] [--rates 0.6,0.8] [--ks 1,2,4,8]
        [--max-tokens 128] [--concurrent 64] [--out DIR] [--tiny --device cpu]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.presets import materialise_preset, random_prompts
from engine import LLM, SamplingParams
from engine.spec.drafter import Draft, Drafter, per_request_k
from engine.spec.measure import measure_costs


class ForcedDrafter(Drafter):
    """The reference run's next tokens, each replaced (by the next id) with probability
    1 - rate: the target's greedy token is drafted with probability `rate`."""

    name = "forced"

    def __init__(self, references: dict[str, list[int]], rate: float, vocab: int, seed=0):
        self.references, self.rate, self.vocab = references, rate, vocab
        self.rng = random.Random(seed)

    def propose(self, requests, k):
        drafts = []
        for req, n in zip(requests, per_request_k(requests, k)):
            known = len(req.token_ids) - req.num_pending
            ref = self.references[req.request_id][known : known + n]
            drafts.append(
                Draft([t if self.rng.random() < self.rate else (t + 1) % self.vocab for t in ref])
            )
        return drafts


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams, ids: list[str]):
    """Run the prompts at once (request ids `ids`); (outputs by id, output tokens / second)."""
    engine = llm.engine
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    seconds = time.perf_counter() - start
    return outs, sum(len(o.token_ids) for o in outs.values()) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-8b", help="a preset of profiles/models")
    ap.add_argument("--rates", default="0.6,0.8")
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tiny", action="store_true", help="a tiny model of the preset (CPU)")
    ap.add_argument("--out", default=None, help="folder for results.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-spec-"))
    folder = materialise_preset(args.model, tmp, tiny=args.tiny)
    need = args.prompt_tokens + args.max_tokens + 16
    llm = LLM(
        str(folder),
        device=args.device,
        load_format="random",
        speculative="ngram",
        num_speculative_tokens=8,  # pinned: no start-up measurement; part 1 measures below
        max_model_len=max(512, -(-need // 256) * 256),
        max_num_seqs=max(64, args.concurrent),
        seed=0,
    )
    engine, spec = llm.engine, llm.engine.spec
    vocab = engine.model_config.vocab_size
    results: dict = {"model": args.model, "device": str(engine.device)}

    table = measure_costs(engine)
    results["cost_ms"] = {f"b={b} k={k}": s * 1e3 for (b, k), s in sorted(table.entries().items())}
    for (b, k), s in sorted(table.entries().items()):
        print(f"cost b={b:3d} k={k}: {s * 1e3:8.2f} ms")

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    prompt = random_prompts(1, args.prompt_tokens, args.prompt_tokens, vocab, seed=1)
    plain_drafter = spec.drafter
    spec.forced_k = 0
    ref, off = timed(llm, prompt, params, ["ref"])
    reference = prompt[0] + ref["ref"].token_ids
    results["batch1_off_tok_s"] = off
    print(f"batch 1, speculation off: {off:.1f} tok/s")
    forced = {}
    for rate in map(float, args.rates.split(",")):
        for k in map(int, args.ks.split(",")):
            rid = f"a{rate}-k{k}"
            spec.drafter = ForcedDrafter({rid: reference}, rate, vocab)
            spec.forced_k = k
            outs, tok_s = timed(llm, prompt, params, [rid])
            assert outs[rid].token_ids == ref["ref"].token_ids, "speculation changed the tokens"
            forced[f"a={rate} k={k}"] = {"tok_s": tok_s, "speedup": tok_s / off}
            print(f"batch 1, a={rate} k={k}: {tok_s:.1f} tok/s, {tok_s / off:.2f}x")
    results["forced"] = forced

    spec.drafter, spec.forced_k = plain_drafter, 0
    lo = min(64, args.prompt_tokens)
    many = random_prompts(args.concurrent, lo, args.prompt_tokens, vocab, seed=2)
    ids = [f"off-{i}" for i in range(len(many))]
    plain_outs, load_off = timed(llm, many, params, ids)
    spec.forced_k = None
    spec.use_costs(table)
    ids = [f"on-{i}" for i in range(len(many))]
    outs, load_on = timed(llm, many, params, ids)
    same = all(
        outs[f"on-{i}"].token_ids == plain_outs[f"off-{i}"].token_ids for i in range(len(many))
    )
    results["load"] = {
        "concurrent": args.concurrent,
        "off_tok_s": load_off,
        "adaptive_tok_s": load_on,
        "ratio": load_on / load_off,
        "identical": same,
        "spec_decode": engine.stats()["spec_decode"],
    }
    print(
        f"{args.concurrent} concurrent: off {load_off:.1f} tok/s, adaptive {load_on:.1f} tok/s "
        f"({load_on / load_off:.3f}x), identical: {same}"
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
