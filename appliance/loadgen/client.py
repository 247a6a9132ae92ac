"""The streaming HTTP client of the load generator: sends one WorkItem as an OpenAI streaming
request and measures TTFT, inter-token latencies, TPOT and E2E, and reads the usage (prompt,
cached and output tokens); failures become data."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

from appliance.loadgen.workload import WorkItem
from tui.sse import events


@dataclass
class ClientConfig:
    """Where and how requests are sent."""

    url: str = "http://127.0.0.1:8000"
    """The appliance's base URL; no traffic goes anywhere else."""
    model: str | None = None
    """The model name sent in each body (None: the server's own)."""
    api_key: str | None = None
    timeout_s: float = 120.0
    """Per-request limit; a request past it counts as a timeout."""

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class RequestResult:
    """What one request measured. Times are seconds; `start` is relative to the run's start."""

    level: float
    """The load level (concurrency or request rate) the request was sent under."""
    start: float
    ok: bool = False
    status: int | None = None
    """The HTTP status (None when no response came: connection error or timeout)."""
    error: str | None = None
    """A short kind: 'http 429', 'http 500', 'timeout', 'connection', 'stream', 'no tokens'."""
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    num_prompt_tokens: int | None = None
    num_output_tokens: int = 0
    """From the server's usage when it sends one, else the number of streamed chunks."""
    num_cached_tokens: int = 0
    """Prompt tokens the server reused from its prefix cache: the usage's
    prompt_tokens_details.cached_tokens (0 when the server leaves it out)."""
    num_chunks: int = 0
    usage_reported: bool = False
    conversation: int | None = None
    """A conversation's turn: the conversation's number."""
    turn: int | None = None
    """A conversation's turn: 1, 2, ..."""
    answer: str | None = None
    """A conversation's turn: the answer's text, which joins the conversation's history."""

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (tokens - 1); None for a one-token answer."""
        if self.ttft_s is None or self.e2e_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)


def request_body(item: WorkItem, cfg: ClientConfig) -> tuple[str, dict]:
    """The endpoint path and JSON body for an item."""
    body: dict = {
        "max_tokens": item.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if item.ignore_eos:
        body["ignore_eos"] = True
    if cfg.model:
        body["model"] = cfg.model
    if item.tools is not None:
        body["tools"] = item.tools
    if item.messages is not None:
        return "/v1/chat/completions", {**body, "messages": item.messages}
    return "/v1/completions", {**body, "prompt": item.prompt}


def _chunk_text(chunk: dict) -> tuple[str, bool]:
    """(the chunk's text, whether it carries any output: text or a tool call's pieces)."""
    text, output = "", False
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        piece = choice.get("text") or delta.get("content") or ""
        text += piece
        output = output or bool(piece or delta.get("tool_calls") or delta.get("reasoning_content"))
    return text, output


async def send(
    session: aiohttp.ClientSession, cfg: ClientConfig, item: WorkItem, level: float, t0: float
) -> RequestResult:
    """Send one streaming request; never raises (except cancellation)."""
    path, body = request_body(item, cfg)
    sent = time.perf_counter()
    result = RequestResult(
        level=level,
        start=sent - t0,
        num_prompt_tokens=item.num_prompt_tokens,
        conversation=item.conversation,
        turn=item.turn,
    )
    pieces: list[str] | None = [] if item.turn is not None else None
    last = None
    try:
        async with asyncio.timeout(cfg.timeout_s):
            async with session.post(cfg.url + path, json=body, headers=cfg.headers()) as resp:
                result.status = resp.status
                if resp.status != 200:
                    await resp.read()
                    result.error = f"http {resp.status}"
                    return result
                async for data in events(resp.content):
                    chunk = json.loads(data)
                    if "error" in chunk:
                        result.error = "stream"
                        return result
                    now = time.perf_counter()
                    text, output = _chunk_text(chunk)
                    if output:
                        result.num_chunks += 1
                        if pieces is not None:
                            pieces.append(text)
                        if last is None:
                            result.ttft_s = now - sent
                        else:
                            result.itl_s.append(now - last)
                        last = now
                    usage = chunk.get("usage")
                    if usage:
                        result.usage_reported = True
                        result.num_prompt_tokens = usage.get("prompt_tokens")
                        result.num_output_tokens = usage.get("completion_tokens", 0)
                        details = usage.get("prompt_tokens_details") or {}
                        result.num_cached_tokens = details.get("cached_tokens") or 0
    except TimeoutError:
        result.error = "timeout"
        return result
    except aiohttp.ClientError as exc:
        result.error = "connection" if result.status is None else f"stream ({type(exc).__name__})"
        return result
    except (ValueError, KeyError):
        result.error = "stream"
        return result
    result.e2e_s = time.perf_counter() - sent
    if pieces is not None:
        result.answer = "".join(pieces)
    if not result.usage_reported:
        result.num_output_tokens = result.num_chunks
    if result.ttft_s is None:
        result.error = "no tokens"
        return result
    result.ok = True
    return result
