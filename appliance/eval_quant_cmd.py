"""`appliance eval-quant` command line: arguments, the rich tables, the JSON file, the exit
status (measurement itself lives in appliance.eval_quant)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from appliance.eval_quant import (
    DEFAULT_CONFIGS,
    DEFAULT_PROMPTS,
    DEFAULT_REFERENCE,
    Options,
    check_thresholds,
    evaluate,
    load_prompts,
    parse_configs,
)
from engine import library_logs


def add_eval_quant_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval-quant",
        help="measure what quantization does to the answers",
        description="Run a prompt set through the unquantized model and each quantized "
        "configuration; report greedy agreement, perplexity on a reference text and mean KL "
        "of next-token distributions, and the answers that differ. Exit status 1 when a "
        "threshold is missed, 3 when a configuration fails to run.",
    )
    p.add_argument("--model", help="HF model folder or .gguf file (default: embedded SmolLM2)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"], default="auto")
    p.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help="comma-separated: w8, w4 (int8/int4 weights), kv8 (int8 KV cache) or "
        f"mixes like w8kv8 (default {DEFAULT_CONFIGS})",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        default=str(DEFAULT_PROMPTS),
        help='JSONL: {"prompt": ..., "max_tokens": N} per line (optional '
        '"category", "expect": text a right answer contains); default: the '
        "shipped long-tail set",
    )
    p.add_argument(
        "--reference",
        metavar="FILE",
        default=str(DEFAULT_REFERENCE),
        help="text scored for perplexity (default: a shipped ~900-token text)",
    )
    p.add_argument("--limit", type=int, help="use only the first N prompts")
    p.add_argument("--max-tokens", type=int, help="cap every prompt's max_tokens")
    p.add_argument(
        "--max-score-tokens",
        type=int,
        default=1024,
        help="tokens of the reference text scored (default 1024)",
    )
    p.add_argument("--chat", action="store_true", help="send prompts through the chat template")
    p.add_argument("--max-model-len", type=int, help="engine max_model_len (default: model's)")
    p.add_argument("--out", metavar="JSON", help="write the full report here")
    p.add_argument("--min-agreement", type=float, help="fail below this mean agreement (0-1)")
    p.add_argument("--max-kl", type=float, help="fail above this mean KL (nats)")
    p.add_argument(
        "--max-ppl-increase",
        type=float,
        metavar="PCT",
        help="fail above this perplexity increase, in percent",
    )
    p.add_argument(
        "--show-diffs",
        type=int,
        default=5,
        help="differing answers to print per config (default 5)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print the engine's log and the libraries' own warnings (bitsandbytes)",
    )
    return p


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _clip(text: str, width: int = 60) -> str:
    """One line of at most `width` characters, safe to print as rich markup."""
    text = text.replace("\n", "⏎")
    return escape(text if len(text) <= width else text[: width - 1] + "…")


def _from_divergence(a: str, b: str, context: int = 16) -> tuple[str, str]:
    """Both answers from `context` characters before their first differing character."""
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, same - context)
    mark = "…" if start else ""
    return mark + a[start:], mark + b[start:]


def print_report(report: dict, console: Console, show_diffs: int) -> None:
    base = report["baseline"]
    n = len(report["prompts"])
    has_expect = sum(p["expect"] is not None for p in report["prompts"])
    table = Table(
        title=f"eval-quant: {escape(report['model'])}, baseline {base['dtype']}, "
        f"{n} prompts, {report['scored_tokens']} scored tokens"
    )
    for col in ("config", "same", "agree", "ppl", "Δppl", "KL mean", "KL max", "hits", "time"):
        table.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    table.add_row(
        "baseline",
        f"{n}/{n}",
        "1.000",
        _fmt(base["perplexity"], ".3f"),
        "-",
        "-",
        "-",
        f"{base['expected_hits']}/{has_expect}",
        f"{base['seconds']:.0f}s",
    )
    for c in report["configs"]:
        if not c["ok"]:
            table.add_row(c["name"], "[red]failed[/]", *[""] * 7)
            continue
        inc = c["ppl_increase_pct"]
        table.add_row(
            c["name"],
            f"{c['identical']}/{n}",
            f"{c['mean_agreement']:.3f}",
            _fmt(c["perplexity"], ".3f"),
            "n/a" if inc is None else f"{inc:+.2f}%",
            _fmt(c["mean_kl"], ".4f"),
            _fmt(c["max_kl"], ".3f"),
            f"{c['expected_hits']}/{has_expect}",
            f"{c['seconds']:.0f}s",
        )
    console.print(table)
    for c in report["configs"]:
        if not c["ok"]:
            console.print(f"[red]{escape(c['name'])} failed:[/] {escape(c['error'])}")
        else:
            divs = ",".join("-" if d is None else str(d) for d in c["first_divergence"])
            console.print(f"{escape(c['name'])} first divergence per prompt: {divs}")
    console.print(
        "same: answers identical to the baseline's; agree: mean share of each answer "
        "before its first differing token (its index: first divergence, - = "
        "identical); KL(baseline || config) in nats per token; hits: answers "
        "containing the prompt's expected text"
    )
    diffs = Table(title="answers that differ", show_lines=True)
    for col in ("config", "prompt", "baseline", "quantized"):
        diffs.add_column(col, overflow="fold")
    shown = 0
    for c in report["configs"]:
        if not c["ok"]:
            continue
        per_config = 0
        for p, d, a, b in zip(
            report["prompts"], c["first_divergence"], base["answers"], c["answers"]
        ):
            if d is not None and per_config < show_diffs:
                a, b = _from_divergence(a, b)
                diffs.add_row(
                    c["name"], _clip(f"[{p['category']}] {p['prompt']}", 40), _clip(a), _clip(b)
                )
                shown += 1
                per_config += 1
    if shown:
        console.print(diffs)


def run_eval_quant(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        library_logs.show()
    try:
        configs = parse_configs(args.configs)
        prompts = load_prompts(args.prompts)
        reference = Path(args.reference).read_text(encoding="utf-8")
    except (ValueError, OSError) as exc:
        print(f"appliance eval-quant: {exc}", file=sys.stderr)
        return 2
    if args.limit is not None:
        prompts = prompts[: args.limit]
    if args.max_tokens is not None:
        for p in prompts:
            p.max_tokens = min(p.max_tokens, args.max_tokens)
    opts = Options([reference], chat=args.chat, max_score_tokens=args.max_score_tokens)
    engine_kwargs = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    try:
        report = evaluate(
            configs,
            prompts,
            opts,
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            engine_kwargs=engine_kwargs,
            progress=lambda msg: err.print(f"[dim]eval-quant: {msg}[/]"),
        )
    except Exception as exc:  # the baseline itself failed: nothing to compare against
        print(f"appliance eval-quant: the baseline failed: {exc}", file=sys.stderr)
        return 3
    missed = check_thresholds(report, args.min_agreement, args.max_kl, args.max_ppl_increase)
    failed = [c["name"] for c in report["configs"] if not c["ok"]]
    report["thresholds"] = {
        "min_agreement": args.min_agreement,
        "max_kl": args.max_kl,
        "max_ppl_increase_pct": args.max_ppl_increase,
    }
    report["missed"], report["failed"] = missed, failed
    report["passed"] = not missed and not failed
    print_report(report, Console(), args.show_diffs)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    for msg in missed:
        err.print(f"[red]threshold missed[/] {msg}")
    for name in failed:
        err.print(f"[red]config failed[/] {name}")
    return 1 if missed else 3 if failed else 0
