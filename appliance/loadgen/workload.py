"""Workloads for the load generator: length distributions, synthetic prompts calibrated by the
server's /tokenize route (token ids, or chat text), a system prompt shared by every request,
multi-turn conversations, and JSONL files of real prompts and lengths."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from appliance.loadgen import agent

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
    conversation: int | None = None
    """A conversation's turn: the conversation's number in the workload stream (0, 1, ...)."""
    turn: int | None = None
    """A conversation's turn: 1 for its first question, 2 for the next, ..."""
    tools: list[dict] | None = None
    """The tools the request carries (an agent's conversation), in OpenAI's shape."""


@dataclass
class Conversation:
    """A multi-turn chat. Turn k sends the system prompt (if any), every earlier question with
    the answer the server gave it, then question k; its answer joins the history."""

    number: int
    questions: list[str]
    max_tokens: list[int]
    """Tokens to generate for each turn's answer."""
    system: str | None = None
    history: list[dict] = field(default_factory=list)
    """The questions and answers so far, as chat messages."""
    tools: list[dict] | None = None
    """An agent's conversation (loadgen/agent.py): every request carries these tools, and each
    turn after the first is the result of the call the previous reply made."""

    @property
    def num_answered(self) -> int:
        return len(self.history) // 2

    def next_item(self) -> WorkItem | None:
        """The next turn's request (None after the last turn)."""
        turn = self.num_answered
        if turn == len(self.questions):
            return None
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        messages = head + self.history + [self._question(turn)]
        return WorkItem(
            self.max_tokens[turn],
            messages=messages,
            conversation=self.number,
            turn=turn + 1,
            tools=self.tools,
        )

    def _question(self, turn: int) -> dict:
        if self.tools is None:
            return {"role": "user", "content": self.questions[turn]}
        return agent.prompt_message(turn, self.questions[turn])

    def add_answer(self, text: str) -> None:
        """The server's answer to the pending question; the next turn sends both."""
        turn = self.num_answered
        reply = {"role": "assistant", "content": text}
        if self.tools is not None:
            reply = agent.reply_message(turn, text)
        self.history += [self._question(turn), reply]


@dataclass
class WorkloadSpec:
    """What to send: synthetic lengths (with an optional shared system prompt, as token ids or
    chat messages, or as multi-turn conversations) or a JSONL file."""

    input_len: LengthDist
    """Prompt tokens after the shared prefix (multi-turn: each question's tokens)."""
    output_len: LengthDist
    """Tokens to generate (multi-turn: each answer's tokens)."""
    prefix_len: int = 0
    """Tokens of a system prompt shared by every synthetic request (prefix-cache workloads)."""
    jsonl: Path | None = None
    """A file of {"prompt"|"messages", "max_tokens"|"output_len"} lines, sent in order."""
    seed: int = 0
    chat: bool = False
    """Synthetic requests as chat messages (the shared prefix as the system message) on
    /v1/chat/completions; False: token-id prompts on /v1/completions."""
    multi_turn: int = 0
    """Turns per conversation (0: single requests); conversations are chats."""
    agent: bool = False
    """Conversations are a coding agent's (loadgen/agent.py): tools in every request, and each
    turn after the first a tool call's result."""

    def __post_init__(self) -> None:
        if self.prefix_len < 0:
            raise ValueError("prefix_len must be >= 0")
        if self.multi_turn < 0:
            raise ValueError(f"--multi-turn must be >= 0, got {self.multi_turn}")
        if self.agent and not self.multi_turn:
            raise ValueError("an agent's workload is conversations: give --multi-turn N")
        if self.jsonl is not None and not Path(self.jsonl).is_file():
            raise ValueError(f"no such JSONL workload file: {self.jsonl}")
        if self.jsonl is not None and (
            self.prefix_len or self.chat or self.multi_turn or self.agent
        ):
            raise ValueError(
                "--prefix-len, --chat, --multi-turn and --agent shape synthetic prompts; a "
                "--jsonl file brings its own: drop one or the other"
            )

    @property
    def is_chat(self) -> bool:
        return self.chat or self.multi_turn > 0

    @property
    def stream_seed(self) -> str:
        """The seed of the request stream: `seed` and the workload's shape, so that a workload
        of another shape draws other tokens (a random-prompt run after a shared-prefix run of
        the same seed would otherwise start with the prefix's tokens and find them cached)."""
        shape = (self.input_len, self.output_len, self.prefix_len, self.chat, self.multi_turn)
        return f"{self.seed} {shape}" + (" agent" if self.agent else "")


@dataclass(frozen=True)
class TokenPool:
    """What the server's tokenizer makes of WORDS: its distinct token ids (synthetic token-id
    prompts draw from them) and tokens per word (synthetic chat text is sized by it)."""

    token_ids: list[int]
    tokens_per_word: float = 1.0

    def ids(self, rng: random.Random, num_tokens: int) -> list[int]:
        return [rng.choice(self.token_ids) for _ in range(num_tokens)]

    def text(self, rng: random.Random, num_tokens: int) -> str:
        """Random words that the server's tokenizer makes about `num_tokens` tokens of."""
        num_words = max(1, round(num_tokens / self.tokens_per_word))
        return " ".join(rng.choice(WORDS) for _ in range(num_words))


async def token_pool(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> TokenPool:
    """Token ids of ordinary words as the server's tokenizer encodes them (one /tokenize call,
    with the same `headers`, the API key among them, as every request)."""
    body = {"prompt": " ".join(WORDS), "add_special_tokens": False}
    async with session.post(f"{url}/tokenize", json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"/tokenize answered {resp.status}: {(await resp.text())[:200]}")
        tokens = (await resp.json())["tokens"]
    pool = sorted(set(tokens))
    if not pool:
        raise RuntimeError("/tokenize returned no tokens")
    return TokenPool(pool, len(tokens) / len(WORDS))


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


def items(spec: WorkloadSpec, pool: TokenPool | None) -> Iterator[WorkItem | Conversation]:
    """An endless stream of requests, or of conversations with `spec.multi_turn` (a JSONL file
    repeats from the top). The same spec gives the same stream: every client process draws the
    same shared prefix."""
    rng = random.Random(spec.stream_seed)
    if spec.jsonl is not None:
        rows = read_jsonl(spec.jsonl, spec.output_len.sample(rng))
        while True:
            yield from rows
    if pool is None:
        raise ValueError("synthetic prompts need the server's token pool")
    if not spec.is_chat:
        prefix = pool.ids(rng, spec.prefix_len)
        while True:
            ids = prefix + pool.ids(rng, spec.input_len.sample(rng))
            yield WorkItem(spec.output_len.sample(rng), prompt=ids, num_prompt_tokens=len(ids))
    system = pool.text(rng, spec.prefix_len) if spec.prefix_len else None
    for number in itertools.count():
        if spec.multi_turn:
            questions = [pool.text(rng, spec.input_len.sample(rng)) for _ in range(spec.multi_turn)]
            lengths = [spec.output_len.sample(rng) for _ in range(spec.multi_turn)]
            tools = agent.AGENT_TOOLS if spec.agent else None
            yield Conversation(number, questions, lengths, system, tools=tools)
        else:
            question = {"role": "user", "content": pool.text(rng, spec.input_len.sample(rng))}
            head = [{"role": "system", "content": system}] if system is not None else []
            yield WorkItem(spec.output_len.sample(rng), messages=head + [question])
