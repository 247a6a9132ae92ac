"""The two grammar libraries for structured outputs, side by side on our tokenizer: how long a
JSON schema takes to compile, and how long filling one step's token bitmask takes while a valid
answer is fed token by token (the host work each constrained request adds to a step).

    .venv/bin/python -m benchmarks.bench_grammar [--model FOLDER] [--repeat 3]

Needs `pip install llguidance xgrammar` (not dependencies of the appliance). Default model:
the embedded SmolLM2-135M-Instruct's tokenizer (49,152 tokens), which the random-weight presets
also use. Prints one row per schema and library, then medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SCHEMAS_FILE = Path(__file__).with_name("grammar_schemas.jsonl")
"""Schemas with a valid answer each (one JSON object a line: "schema", "answer"): enums,
bounds, minItems, patterns, anyOf, nesting."""


def setup_seconds(tokenizer) -> dict[str, float]:
    """Each library's one-time work on a tokenizer (once per server start)."""
    import llguidance.hf
    import xgrammar as xgr

    start = time.perf_counter()
    llguidance.hf.from_tokenizer(tokenizer)
    llg = time.perf_counter() - start
    start = time.perf_counter()
    xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer)))
    return {"llguidance": llg, "xgrammar": time.perf_counter() - start}


def answer_ids(tokenizer, instance: dict) -> list[int]:
    return tokenizer.encode(json.dumps(instance), add_special_tokens=False)


def bench_llguidance(tokenizer, schema: dict, ids: list[int], eos: int) -> tuple[float, list]:
    import llguidance
    import llguidance.hf
    from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

    tok = llguidance.hf.from_tokenizer(tokenizer)
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    matcher = llguidance.LLMatcher(tok, grammar)
    compile_s = time.perf_counter() - start
    mask = allocate_token_bitmask(1, tok.vocab_size)
    steps = []
    for t in [*ids, eos]:
        start = time.perf_counter()
        fill_next_token_bitmask(matcher, mask, 0)
        steps.append(time.perf_counter() - start)
        assert (mask[0, t // 32] >> (t % 32)) & 1, "llguidance refused a valid token"
        assert matcher.consume_token(t), matcher.get_error()
    return compile_s, steps


def bench_xgrammar(tokenizer, schema: dict, ids: list[int], eos: int) -> tuple[float, list]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(schema))
    compile_s = time.perf_counter() - start
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    steps = []
    for t in [*ids, eos]:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        steps.append(time.perf_counter() - start)
        assert (mask[0, t // 32] >> (t % 32)) & 1, "xgrammar refused a valid token"
        assert matcher.accept_token(t)
    return compile_s, steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per schema (the median is kept)")
    args = ap.parse_args()
    from engine.models.loader import resolve_model_folder
    from engine.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_folder(args.model))
    eos = tokenizer.eos_token_id
    libs = {"llguidance": bench_llguidance, "xgrammar": bench_xgrammar}
    totals: dict[str, dict[str, list]] = {name: {"compile": [], "mask": []} for name in libs}
    setup = setup_seconds(tokenizer)
    print(
        f"tokenizer: {len(tokenizer)} tokens; setup per tokenizer: "
        + ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in setup.items())
    )
    cases = [json.loads(line) for line in SCHEMAS_FILE.read_text().splitlines() if line]
    for i, case in enumerate(cases):
        schema, instance = case["schema"], case["answer"]
        ids = answer_ids(tokenizer, instance)
        for name, bench in libs.items():
            runs = [bench(tokenizer, schema, ids, eos) for _ in range(args.repeat)]
            compile_s = statistics.median(r[0] for r in runs)
            mask_s = statistics.median(s for r in runs for s in r[1])
            totals[name]["compile"].append(compile_s)
            totals[name]["mask"].append(mask_s)
            print(
                f"schema {i}: {name:10s} compile {compile_s * 1e3:8.2f} ms, mask median "
                f"{mask_s * 1e6:7.1f} us over {len(ids) + 1} steps"
            )
    for name, t in totals.items():
        compile_ms = [s * 1e3 for s in t["compile"]]
        mask_us = statistics.median(t["mask"]) * 1e6
        print(
            f"{name}: compile median {statistics.median(compile_ms):.2f} ms "
            f"(max {max(compile_ms):.2f}), mask median {mask_us:.1f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
