"""scripts/bench_structured.py's figures: each arm's TPOT and throughput, the loss against the
goals, the grammar's compile and mask times, and the markdown table for docs/performance.md."""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.structured_schemas import wide_schema
from engine.structured import StructuredOutput
from engine.structured.bitmask import words_for
from engine.structured.llguidance_backend import LLGuidanceBackend

ARMS = ("unconstrained", "json_schema")
"""The two kinds of request compared; "json_schema" requests carry the benchmark's schema."""
GOALS_PCT = {"batch1": 3.0, "concurrent": 5.0}
"""The most TPOT (batch 1) and output throughput (concurrent) a schema may cost, in percent."""
WIDE_PROPERTIES = 50
CACHED_CALLS = 20


# --- compile -------------------------------------------------------------------------------------
def compile_times(engine, repeats: int) -> dict:
    """A WIDE_PROPERTIES-property schema on `repeats` fresh backends (the engine's tokenizer,
    vocabulary and EOS ids): the backend's setup, the first compile (no cache; compile plus a
    matcher at its start, as the engine's grammar pool times it), that matcher's first mask,
    and the same schema again (the cache), CACHED_CALLS times per backend. Medians in ms."""
    spec = StructuredOutput.json_schema(wide_schema(WIDE_PROPERTIES))
    vocab = engine.model_config.vocab_size
    setup, first, first_mask, cached = [], [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        backend = LLGuidanceBackend(engine.tokenizer, vocab, engine.eos_token_ids)
        setup.append(time.perf_counter() - start)
        start = time.perf_counter()
        matcher = backend.matcher(backend.compile(spec))
        first.append(time.perf_counter() - start)
        bitmask = torch.full((1, words_for(vocab)), -1, dtype=torch.int32)
        start = time.perf_counter()
        backend.fill([(matcher, 0)], bitmask)
        first_mask.append(time.perf_counter() - start)
        bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = int(bits.view(-1)[:vocab].sum())  # a mask that constrains nothing is wrong
        if not 0 < allowed < vocab:
            raise RuntimeError(f"the wide schema's first mask allows {allowed} of {vocab} tokens")
        for _ in range(CACHED_CALLS):
            start = time.perf_counter()
            backend.matcher(backend.compile(spec))
            cached.append(time.perf_counter() - start)

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    return {
        "properties": WIDE_PROPERTIES,
        "backends": repeats,
        "setup_ms": ms(setup),
        "first_ms": ms(first),
        "first_ms_runs": [s * 1e3 for s in first],
        "first_mask_ms": ms(first_mask),
        "cached_ms": ms(cached),
        "cached_calls": len(cached),
    }


# --- the arms ------------------------------------------------------------------------------------
def _tpot_s(out) -> float:
    m = out.metrics
    return (m.finished_time - m.first_token_time) / (len(out.token_ids) - 1)


def grammar_stats(outputs: list) -> dict:
    """From each constrained request's "grammar" trace event: the host's mask time per step (at
    a batch of several, the fill of the whole step's bitmask), its worst step, the compile the
    request waited for (a cache hit after the warm-up)."""
    events = [e.detail for o in outputs for e in o.trace if e.event == "grammar"]
    if len(events) != len(outputs):
        raise RuntimeError(
            f"{len(outputs) - len(events)} constrained requests have no grammar trace"
        )
    return {
        "mask_ms_mean_p50": statistics.median(e["mask_ms_mean"] for e in events),
        "mask_ms_mean_max": max(e["mask_ms_mean"] for e in events),
        "mask_ms_max": max(e["mask_ms_max"] for e in events),
        "mask_steps_p50": statistics.median(e["mask_steps"] for e in events),
        "compile_ms_p50": statistics.median(e["compile_ms"] for e in events),
    }


def arm_figures(waves: list[dict], arm: str) -> dict:
    mine = [w for w in waves if w["arm"] == arm]
    outputs = [o for w in mine for o in w["outputs"]]
    tokens = sum(len(o.token_ids) for o in outputs)
    wall = sum(w["wall_s"] for w in mine)
    tpot = [_tpot_s(o) for o in outputs]
    figures = {
        "requests": len(outputs),
        "output_tokens": tokens,
        "wall_s": wall,
        "out_tok_s": tokens / wall,
        "wave_out_tok_s": [sum(len(o.token_ids) for o in w["outputs"]) / w["wall_s"] for w in mine],
        "tpot_p50_s": statistics.median(tpot),
        "tpot_s": tpot,
    }
    if arm == "json_schema":
        figures["grammar"] = grammar_stats(outputs)
    return figures


def _verdict(loss_pct: float, goal_pct: float) -> str:
    return "pass" if loss_pct <= goal_pct else "miss"


def summarise(batch1: list[dict], concurrent: list[dict], concurrency: int) -> dict:
    """Both phases' arms and their loss: TPOT at batch 1, output tok/s at `concurrency`."""
    b = {arm: arm_figures(batch1, arm) for arm in ARMS}
    c = {arm: arm_figures(concurrent, arm) for arm in ARMS}
    tpot_loss = (b["json_schema"]["tpot_p50_s"] / b["unconstrained"]["tpot_p50_s"] - 1) * 100
    tput_loss = (1 - c["json_schema"]["out_tok_s"] / c["unconstrained"]["out_tok_s"]) * 100
    return {
        "batch1": {
            **b,
            "tpot_loss_pct": tpot_loss,
            "goal_pct": GOALS_PCT["batch1"],
            "verdict": _verdict(tpot_loss, GOALS_PCT["batch1"]),
        },
        "concurrent": {
            **c,
            "concurrency": concurrency,
            "throughput_loss_pct": tput_loss,
            "goal_pct": GOALS_PCT["concurrent"],
            "verdict": _verdict(tput_loss, GOALS_PCT["concurrent"]),
        },
    }


# --- the table -----------------------------------------------------------------------------------
def _range(values: list[float], scale: float = 1.0, fmt: str = ",.0f") -> str:
    """(lowest-highest) of the runs, to judge a loss against the spread."""
    return f"({min(values) * scale:{fmt}}-{max(values) * scale:{fmt}})"


def _spread(values: list[float], scale: float, fmt: str) -> str:
    return f"{statistics.median(values) * scale:{fmt}} {_range(values, scale, fmt)}"


def markdown(r: dict) -> str:
    """The tables for docs/performance.md."""
    b, c, floor, comp = r["batch1"], r["concurrent"], r["floor"], r["compile"]
    bu, bs, cu, cs = b["unconstrained"], b["json_schema"], c["unconstrained"], c["json_schema"]
    w = r["workload"]
    n = c["concurrency"]
    valid = sum(x["requests"] for x in (bs, cs)) - sum("broke" in p for p in r["problems"])
    lines = [
        f"{r['model']} on {r['device']}, random weights, {r['config'].get('dtype')}; prompts of "
        f"{w['prompt_tokens']} random token ids, {w['output_tokens']} output tokens, greedy, "
        f"ignore_eos; {w['rounds']} rounds of A B B A after a warm-up per arm; constrained "
        f"outputs that are valid JSON-so-far: {valid} of {bs['requests'] + cs['requests']}.",
        "",
        "| | unconstrained | JSON schema | loss | goal |",
        "|---|---|---|---|---|",
        f"| batch 1: TPOT p50, ms (floor {floor['batch1_tpot_s'] * 1e3:.2f}) "
        f"| {_spread(bu['tpot_s'], 1e3, '.2f')} | {_spread(bs['tpot_s'], 1e3, '.2f')} "
        f"| {b['tpot_loss_pct']:.1f}% | <= {b['goal_pct']:g}%: {b['verdict']} |",
        f"| {n} concurrent: out tok/s (floor {floor['wave_out_tok_s']:,.0f}) "
        f"| {cu['out_tok_s']:,.1f} {_range(cu['wave_out_tok_s'])} "
        f"| {cs['out_tok_s']:,.1f} {_range(cs['wave_out_tok_s'])} "
        f"| {c['throughput_loss_pct']:.1f}% | <= {c['goal_pct']:g}%: {c['verdict']} |",
        f"| {n} concurrent: TPOT p50 | {cu['tpot_p50_s'] * 1e3:.2f} ms "
        f"| {cs['tpot_p50_s'] * 1e3:.2f} ms | | |",
        "",
        "| grammar work on the host (llguidance) | |",
        "|---|---|",
        f"| {comp['properties']}-property schema, first compile (fresh backend, median of "
        f"{comp['backends']}) | {comp['first_ms']:.2f} ms |",
        f"| the same schema again (cached, median of {comp['cached_calls']}) "
        f"| {comp['cached_ms']:.3f} ms |",
        f"| its first mask | {comp['first_mask_ms']:.2f} ms |",
        f"| backend setup per tokenizer (once per engine) | {comp['setup_ms']:.0f} ms |",
    ]
    for label, arm in (("batch 1", bs), (f"{n} concurrent", cs)):
        g = arm["grammar"]
        lines.append(
            f"| mask per step, {label}: median of requests' means (worst step) "
            f"| {g['mask_ms_mean_p50']:.3f} ms ({g['mask_ms_max']:.2f} ms) |"
        )
    return "\n".join(lines)
