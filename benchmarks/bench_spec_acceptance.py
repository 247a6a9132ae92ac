"""Acceptance of n-gram drafts on real text: the embedded SmolLM2-135M-Instruct on the CPU
answers each prompt of benchmarks/spec_prompts.jsonl greedily, then the n-gram drafter is replayed
over each answer as a greedy speculative run would use it (each step drafts up to k tokens
from the prompt and the answer so far, the drafts matching the answer are accepted, one more
token comes from the model). Greedy speculation emits the same answer, so this measures its
acceptance without the verification loop.

    .venv/bin/python -m benchmarks.bench_spec_acceptance [--max-tokens 128] [--per-kind 8]
        [--min-n 2] [--max-n 4] [--json out.json] [--answers answers.json]

--answers keeps the generated answers in that file and reuses them when it exists (the replay
with other n-gram sizes takes seconds; the generation takes minutes).

Prints, per prompt kind and k = 1..8: the acceptance rate (accepted / drafted tokens), the mean
accepted length (accepted drafts per step that had a draft) and the tokens per forward (answer
tokens / verify steps: the speed-up if a verify step cost as much as a plain decode step; the
floor is 1.0, decoding without speculation).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from engine import LLM, SamplingParams
from engine.spec.ngram import DEFAULT_MAX_N, DEFAULT_MIN_N, NgramDrafter

PROMPTS_FILE = Path(__file__).with_name("spec_prompts.jsonl")
KINDS = ("edit", "summarise", "grounded", "chat")
"""The prompt kinds, in the order of the tables (the jsonl's `kind` values)."""
KS = range(1, 9)


@dataclass
class _Seq:
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    num_pending: int = 0


@dataclass
class Tally:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    steps_with_draft: int = 0
    tokens: int = 0

    def add(self, other: Tally) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def accepted_length(self) -> float:
        return self.accepted / self.steps_with_draft if self.steps_with_draft else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def replay(prompt: list[int], answer: list[int], k: int, drafter: NgramDrafter) -> Tally:
    """A greedy speculative run over `answer` with up to k n-gram drafts a step."""
    seq = _Seq(f"replay-{k}", list(prompt))
    tally = Tally(tokens=len(answer))
    pos = 0
    while pos < len(answer):
        # no drafts past the answer's end (its last token: EOS or max_tokens)
        draft = drafter.propose([seq], min(k, len(answer) - pos))[0].token_ids
        matched = 0
        while matched < len(draft) and draft[matched] == answer[pos + matched]:
            matched += 1
        tally.drafted += len(draft)
        tally.accepted += matched
        tally.steps += 1
        tally.steps_with_draft += bool(draft)
        step = answer[pos : pos + matched + 1]
        seq.token_ids += step
        pos += len(step)
    drafter.release(seq.request_id)
    return tally


def generate(rows: list[dict], max_tokens: int, cache: Path | None, console: Console):
    """(prompt ids, greedy answer ids) per row, from `cache` when it holds these prompts."""
    if cache is not None and cache.exists():
        saved = json.loads(cache.read_text())
        if saved["rows"] == rows and saved["max_tokens"] == max_tokens:
            console.print(f"answers from {cache}")
            return saved["prompts"], saved["answers"]
    llm = LLM(None, device="cpu", dtype="float32")
    prompts = [
        llm.engine.apply_chat_template([{"role": "user", "content": r["prompt"]}]) for r in rows
    ]
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    elapsed = time.perf_counter() - start
    answers = [o.token_ids for o in outs]
    console.print(
        f"{len(rows)} prompts, {sum(map(len, answers))} answer tokens generated greedily "
        f"(max {max_tokens} each) in {elapsed:.1f} s"
    )
    if cache is not None:
        data = {"rows": rows, "max_tokens": max_tokens, "prompts": prompts, "answers": answers}
        cache.write_text(json.dumps(data))
    return prompts, answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--per-kind", type=int, default=8, help="prompts of each kind (a subset)")
    ap.add_argument("--min-n", type=int, default=DEFAULT_MIN_N)
    ap.add_argument("--max-n", type=int, default=DEFAULT_MAX_N)
    ap.add_argument("--json", type=Path, help="write the per-kind, per-k figures here")
    ap.add_argument("--answers", type=Path, help="cache of the generated answers")
    args = ap.parse_args()
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    unknown = {r["kind"] for r in rows} - set(KINDS)
    if unknown:
        raise SystemExit(f"{PROMPTS_FILE}: unknown kinds {sorted(unknown)}; known: {KINDS}")
    rows = [r for kind in KINDS for r in [x for x in rows if x["kind"] == kind][: args.per_kind]]
    console = Console()
    prompts, answers = generate(rows, args.max_tokens, args.answers, console)
    console.print(f"n-gram sizes {args.max_n}..{args.min_n}")
    drafter = NgramDrafter(args.min_n, args.max_n)
    tallies = {(kind, k): Tally() for kind in KINDS + ("all",) for k in KS}
    for row, prompt, answer in zip(rows, prompts, answers):
        for k in KS:
            t = replay(prompt, answer, k, drafter)
            tallies[(row["kind"], k)].add(t)
            tallies[("all", k)].add(t)
    metrics = (
        ("acceptance rate (accepted / drafted)", "acceptance", "{:.2f}"),
        (
            "mean accepted length (accepted drafts per step with a draft)",
            "accepted_length",
            "{:.2f}",
        ),
        ("tokens per forward (floor without speculation: 1.00)", "tokens_per_step", "{:.2f}"),
    )
    for title, attr, fmt in metrics:
        table = Table(title=title)
        table.add_column("kind")
        for k in KS:
            table.add_column(f"k={k}", justify="right")
        for kind in KINDS + ("all",):
            table.add_row(kind, *(fmt.format(getattr(tallies[(kind, k)], attr)) for k in KS))
        console.print(table)
    if args.json:
        data = {
            f"{kind}/k={k}": {
                "acceptance": t.acceptance,
                "accepted_length": t.accepted_length,
                "tokens_per_step": t.tokens_per_step,
                **t.__dict__,
            }
            for (kind, k), t in tallies.items()
        }
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
