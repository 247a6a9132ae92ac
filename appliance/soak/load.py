"""The soak's load: ordinary requests (chat and completion, streamed or not, short and long
prompts, from each API key in turn) at a set concurrency, with mid-stream disconnects mixed in,
and at set points of each interval a burst of malformed bodies, an abort storm and a 429 storm.
Every request is entered in the Recorder's ledger when sent and again when it ends."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp

from appliance.loadgen.workload import WORDS
from appliance.soak.rules import Interval, Ledger
from tui.sse import DONE, SSEParser

ORDINARY = ("chat_stream", "chat", "completion_stream", "completion")
DISCONNECT_SHARE = 0.1
"""Of the workers' requests, the share that are streams closed after DISCONNECT_AFTER chunks
(the default of LoadConfig.disconnect_share)."""
DISCONNECT_AFTER = 3
REJECTED_PAUSE_S = 0.5
"""How long a worker waits after a 429 before its next request (no busy loop of 429s)."""
LONG_SHARE = 0.25
"""Of the ordinary requests, the share with a long prompt."""
MALFORMED_BODIES = (
    b"{not json",
    b'{"prompt": "hi", "max_tokens": -5}',
    b'{"prompt": "hi", "temperature": "hot"}',
    b'{"messages": "hello"}',
    b'{"messages": [{"role": "wizard", "content": "hi"}]}',
    b'{"prompt": "hi", "n": 0}',
)
"""Bodies the server must refuse with 400 (sent to both endpoints)."""


@dataclass
class LoadConfig:
    """Where the load goes and its shape."""

    url: str
    api_keys: list[str | None]
    """Requests cycle through these (None: no Authorization header)."""
    concurrency: int
    storm_size: int
    """Requests in one 429 storm: past the server's running slots plus its queue."""
    model: str | None = None
    timeout_s: float = 120.0
    short_words: tuple[int, int] = (8, 40)
    long_words: tuple[int, int] = (150, 300)
    max_tokens: tuple[int, int] = (16, 64)
    disconnect_share: float = DISCONNECT_SHARE


@dataclass
class Recorder:
    """The ledger of the whole run and the interval now running (swapped at each boundary)."""

    ledger: Ledger = field(default_factory=Ledger)
    interval: Interval | None = None
    num_storms: int = 0
    """429 storms begun or ended so far: odd while one runs."""

    def end(self, kind: str, ending: str) -> None:
        self.ledger.end(kind, ending)
        self.interval.endings[ending] += 1


def ending_of(status: int) -> str:
    """The ending of a non-200 answer."""
    if status == 429:
        return "rejected"
    if status == 400:
        return "bad_request"
    return "http_5xx" if status >= 500 else "http_4xx"


def body_for(cfg: LoadConfig, kind: str, rng: random.Random) -> dict:
    """An ordinary request's body; `kind` names the endpoint and whether it streams."""
    low, high = cfg.long_words if rng.random() < LONG_SHARE else cfg.short_words
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
    body: dict = {"max_tokens": rng.randint(*cfg.max_tokens), "ignore_eos": True}
    body["temperature"] = rng.choice((0.0, 0.7))
    if kind.endswith("_stream") or kind == "disconnect":
        body.update(stream=True, stream_options={"include_usage": True})
    if cfg.model:
        body["model"] = cfg.model
    if kind.startswith("chat") or (kind == "disconnect" and rng.random() < 0.5):
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


class Client:
    """Sends requests and enters each in the recorder."""

    def __init__(self, session: aiohttp.ClientSession, cfg: LoadConfig, rec: Recorder) -> None:
        self.session, self.cfg, self.rec = session, cfg, rec
        self._next_key = 0

    def headers(self, key: str | None = None) -> dict[str, str]:
        if key is None:
            key = self.cfg.api_keys[self._next_key % len(self.cfg.api_keys)]
            self._next_key += 1
        headers = {"Content-Type": "application/json"}
        return headers | ({"Authorization": f"Bearer {key}"} if key else {})

    async def send(self, kind: str, body: dict | bytes, key: str | None = None) -> str:
        """One request, entered in the ledger when sent and when it ends (cancellation ends
        it as aborted); returns how it ended and never raises otherwise."""
        path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else None
        path = path or ("/v1/completions" if isinstance(body, dict) else self._malformed_path())
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.rec.ledger.send(kind)
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                ending = await self._exchange(kind, path, data, self.headers(key))
        except asyncio.CancelledError:
            self.rec.end(kind, "aborted")
            raise
        except TimeoutError:
            ending = "timeout"
        except aiohttp.ClientError:
            ending = "connection"
        self.rec.end(kind, ending)
        return ending

    def _malformed_path(self) -> str:
        self._next_key += 1
        return ("/v1/completions", "/v1/chat/completions")[self._next_key % 2]

    async def _exchange(self, kind: str, path: str, data: bytes, headers: dict) -> str:
        sent, storms = time.perf_counter(), self.rec.num_storms
        async with self.session.post(self.cfg.url + path, data=data, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                return ending_of(resp.status)
            if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                doc = json.loads(await resp.read())
                return "completed" if doc.get("choices") else "truncated"
            return await self._stream(kind, resp, sent, storms)

    async def _stream(
        self, kind: str, resp: aiohttp.ClientResponse, sent: float, storms: int
    ) -> str:
        """Read a stream to [DONE]; a disconnect closes it after a few chunks. Its TTFT and
        TPOT count when no 429 storm ran while it did: a storm's admitted requests fill the
        queue on purpose, and whether a stream waited behind them is chance, not drift."""
        parser, first, last, num_chunks, num_tokens = SSEParser(), None, None, 0, None
        async for raw in resp.content.iter_any():
            for data in parser.feed(raw):
                if data == DONE:
                    calm = storms == self.rec.num_storms and storms % 2 == 0
                    if calm and first is not None and num_tokens and num_tokens > 1:
                        self.rec.interval.ttft_s.append(first - sent)
                        self.rec.interval.tpot_s.append((last - first) / (num_tokens - 1))
                    return "completed"
                chunk = json.loads(data)
                if "error" in chunk:
                    return "error_event"
                if chunk.get("usage"):
                    num_tokens = chunk["usage"].get("completion_tokens")
                if any(_has_text(c) for c in chunk.get("choices") or ()):
                    last = time.perf_counter()
                    first = first or last
                    num_chunks += 1
                    if kind == "disconnect" and num_chunks >= DISCONNECT_AFTER:
                        resp.close()
                        return "disconnected"
        return "truncated"

    async def malformed(self) -> None:
        """Every malformed body once."""
        await asyncio.gather(*(self.send("malformed", b) for b in MALFORMED_BODIES))

    async def abort_storm(self, rng: random.Random, num: int) -> None:
        """`num` streamed requests, each cancelled 0-50 ms after it was sent."""

        async def one() -> None:
            task = asyncio.create_task(self.send("abort", body_for(self.cfg, "chat_stream", rng)))
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        await asyncio.gather(*(one() for _ in range(num)))

    async def storm(self, rng: random.Random) -> None:
        """storm_size short requests at once from one key: past the queue, so some get 429."""
        key = self.cfg.api_keys[0]
        bodies = [body_for(self.cfg, "completion", rng) for _ in range(self.cfg.storm_size)]
        for body in bodies:
            body["max_tokens"] = 2
        self.rec.num_storms += 1
        try:
            await asyncio.gather(*(self.send("storm", b, key) for b in bodies))
        finally:
            self.rec.num_storms += 1


def _has_text(choice: dict) -> bool:
    return bool(choice.get("text") or (choice.get("delta") or {}).get("content"))


async def run_load(client: Client, rng: random.Random, seconds: float) -> None:
    """Hold the concurrency for `seconds`, then wait for every request to end. A quarter of
    the way in: the malformed bodies; half-way: an abort storm of twice the concurrency;
    three quarters: the 429 storm."""
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            cut = rng.random() < client.cfg.disconnect_share
            kind = "disconnect" if cut else rng.choice(ORDINARY)
            if await client.send(kind, body_for(client.cfg, kind, rng)) == "rejected":
                await asyncio.sleep(REJECTED_PAUSE_S)  # as a client told to retry later would

    async def chaos() -> None:
        events = (
            (0.25, client.malformed),
            (0.5, lambda: client.abort_storm(rng, 2 * client.cfg.concurrency)),
            (0.75, lambda: client.storm(rng)),
        )
        start = time.perf_counter()
        for share, event in events:
            await asyncio.sleep(max(0.0, start + share * seconds - time.perf_counter()))
            await event()

    await asyncio.gather(chaos(), *(worker() for _ in range(client.cfg.concurrency)))
