"""Workloads for the load generator: length distributions, synthetic prompts calibrated by the
server's /tokenize route, shared-prefix prompts, and JSONL files of real prompts and lengths."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

# Ordinary words: the token pool comes from how the server tokenizes them, so synthetic prompts
# are made of tokens that real text would produce (no special or control tokens).
WORDS = (
    "the of and to in is was for that with as on by at from his her are were which this an be "
    "has had have not but they its their one all new more first time year people two other city "
    "world over after some into can would made about only state many world water light house "
    "music river school family history paper market system garden window morning number group "
    "place story island summer winter country company question answer simple quiet bright small "
    "large early later north south east west train bridge mountain forest letter doctor village "
    "engine memory signal planet energy coffee orange purple silver yellow circle square animal"
).split()


@dataclass(frozen=True)
class LengthDist:
    """A token-count distribution: `128` (fixed), `uniform:64-256`, `normal:128,32`, `exp:128`."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str | int) -> LengthDist:
        text = str(spec).strip()
        kind, _, rest = text.partition(":")
        try:
            if not rest:
                return cls("fixed", float(int(kind)))
            if kind == "uniform":
                lo, hi = rest.split("-")
                return cls("uniform", float(int(lo)), float(int(hi)))
            if kind == "normal":
                mean, std = rest.split(",")
                return cls("normal", float(mean), float(std))
            if kind == "exp":
                return cls("exp", float(rest))
        except ValueError:
            pass
        raise ValueError(
            f"bad length spec {text!r}: use N, uniform:LO-HI, normal:MEAN,STD or exp:MEAN"
        )

    def __post_init__(self) -> None:
        if self.a < 0 or self.b < 0 or (self.kind == "uniform" and self.b < self.a):
            raise ValueError(f"bad length distribution {self}")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(int(self.a), int(self.b))
        elif self.kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:
            value = rng.expovariate(1.0 / self.a) if self.a > 0 else 0
        return max(1, round(value))


@dataclass
class WorkItem:
    """One request to send: a prompt (text or token ids) or chat messages, and its lengths."""

    max_tokens: int
    """Tokens to generate (the server is asked to ignore EOS when `ignore_eos`)."""
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    num_prompt_tokens: int | None = None
    """The prompt length when known in advance (token-id prompts)."""
    ignore_eos: bool = True


@dataclass
class WorkloadSpec:
    """What to send: synthetic lengths (with an optional shared prefix) or a JSONL file."""

    input_len: LengthDist
    output_len: LengthDist
    prefix_len: int = 0
    """Tokens of a system prompt shared by every synthetic request (prefix-cache workloads)."""
    jsonl: Path | None = None
    """A file of {"prompt"|"messages", "max_tokens"|"output_len"} lines, sent in order."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prefix_len < 0:
            raise ValueError("prefix_len must be >= 0")
        if self.jsonl is not None and not Path(self.jsonl).is_file():
            raise ValueError(f"no such JSONL workload file: {self.jsonl}")


async def token_pool(session: aiohttp.ClientSession, url: str) -> list[int]:
    """Token ids of ordinary words as the server's tokenizer encodes them (one /tokenize call)."""
    body = {"prompt": " ".join(WORDS), "add_special_tokens": False}
    async with session.post(f"{url}/tokenize", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"/tokenize answered {resp.status}: {(await resp.text())[:200]}")
        tokens = (await resp.json())["tokens"]
    pool = sorted(set(tokens))
    if not pool:
        raise RuntimeError("/tokenize returned no tokens")
    return pool


def read_jsonl(path: Path, default_max_tokens: int) -> list[WorkItem]:
    """Items of a JSONL workload; lines without a length use `default_max_tokens` and EOS."""
    items = []
    for num, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{num}: not JSON ({exc.msg})") from None
        length = row.get("max_tokens", row.get("output_len"))
        if "messages" in row:
            item = WorkItem(int(length or default_max_tokens), messages=row["messages"])
        elif "prompt" in row:
            item = WorkItem(int(length or default_max_tokens), prompt=row["prompt"])
        else:
            raise ValueError(f"{path}:{num}: needs 'prompt' or 'messages'")
        item.ignore_eos = length is not None
        items.append(item)
    if not items:
        raise ValueError(f"{path}: no requests")
    return items


def items(spec: WorkloadSpec, pool: list[int]) -> Iterator[WorkItem]:
    """An endless stream of requests (a JSONL file repeats from the top)."""
    rng = random.Random(spec.seed)
    if spec.jsonl is not None:
        rows = read_jsonl(spec.jsonl, spec.output_len.sample(rng))
        while True:
            yield from rows
    prefix = [rng.choice(pool) for _ in range(spec.prefix_len)]
    while True:
        ids = prefix + [rng.choice(pool) for _ in range(spec.input_len.sample(rng))]
        yield WorkItem(spec.output_len.sample(rng), prompt=ids, num_prompt_tokens=len(ids))
