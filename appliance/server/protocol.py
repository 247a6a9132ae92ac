"""Parsing and validation of OpenAI request bodies into a GenerateRequest (no I/O, no engine).

Every rejection is an APIError(400) whose message names the parameter and the allowed range.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from aiohttp import web

from appliance.server.errors import bad_request
from engine.sampling_params import SamplingParams

MAX_STOP = 16
_IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "stream_options"}
_SAMPLING = {
    "max_tokens", "temperature", "top_p", "n", "stream", "stop", "presence_penalty",
    "frequency_penalty", "seed", "logit_bias", "top_k", "min_p", "repetition_penalty",
    "ignore_eos", "stop_token_ids", "skip_special_tokens", "model",
}  # fmt: skip
COMPLETION_FIELDS = _SAMPLING | _IGNORED | {"prompt", "logprobs", "echo", "suffix", "best_of"}
CHAT_FIELDS = _SAMPLING | _IGNORED | {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
    "tools", "tool_choice", "functions", "function_call", "modalities",
}  # fmt: skip
ROLES = ("system", "developer", "user", "assistant", "tool")


async def read_json(request: web.Request) -> dict:
    """The body as a JSON object; 400 for invalid UTF-8/JSON, 413 (from aiohttp) when too big."""
    raw = await request.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"request body is not valid UTF-8 (bad byte at offset {exc.start})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise bad_request("request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    return data


@dataclass
class GenerateRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    endpoint: str
    """'completions' or 'chat'."""
    model: str | None
    prompts: list[str | list[int]] = field(default_factory=list)
    """Completions: each prompt gets n choices."""
    messages: list[dict] | None = None
    """Chat: normalised to {'role', 'content': str}."""
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    """None = the endpoint's default (16 for completions, the rest of the context for chat)."""
    logprobs: int | None = None
    """Top-n alternatives to return; None = no logprobs."""
    seed: int | None = None
    sampling: dict = field(default_factory=dict)

    def params(self, choice: int, max_tokens: int) -> SamplingParams:
        """SamplingParams for one choice; choice i of a seeded request uses seed + i."""
        seed = None if self.seed is None else (self.seed + choice) % (1 << 63)
        try:
            return SamplingParams(
                max_tokens=max_tokens, seed=seed, logprobs=self.logprobs, **self.sampling
            )
        except ValueError as exc:
            raise bad_request(str(exc)) from None


class _Fields:
    def __init__(self, data: dict) -> None:
        self.data = data

    def get(self, name: str, kind: str, default=None, lo=None, hi=None, lo_open=False):
        value = self.data.get(name)
        if value is None:
            return default
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
        }[kind]
        if not ok:
            article = "an" if kind == "int" else "a"
            what = {"int": "integer", "number": "number", "bool": "boolean", "str": "string"}[kind]
            raise bad_request(
                f"'{name}' must be {article} {what}, got {_json_type(value)}", param=name
            )
        if kind == "number":
            if not math.isfinite(value):
                raise bad_request(f"'{name}' must be a finite number", param=name)
            value = float(value)
        if kind in ("int", "number") and (lo is not None or hi is not None):
            below = lo is not None and (value <= lo if lo_open else value < lo)
            above = hi is not None and value > hi
            if below or above:
                raise bad_request(f"'{name}' must be {_range(lo, hi, lo_open)}, got {value}", name)
        return value


def _range(lo, hi, lo_open) -> str:
    if hi is None:
        return f"{'>' if lo_open else '>='} {lo}"
    if lo is None:
        return f"<= {hi}"
    return f"in {'(' if lo_open else '['}{lo}, {hi}]"


def _json_type(value) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _check_unknown(data: dict, allowed: set[str]) -> None:
    for name in data:
        if name not in allowed:
            raise bad_request(f"Unrecognized request argument supplied: {name}", param=name)


def _unsupported(data: dict, name: str, is_default) -> None:
    if name in data and data[name] is not None and not is_default(data[name]):
        raise bad_request(f"'{name}' is not supported by this server", param=name)


def _parse_common(data: dict, endpoint: str) -> GenerateRequest:
    f = _Fields(data)
    model = f.get("model", "str")
    stream = f.get("stream", "bool", False)
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    include_usage = bool(stream and options and options.get("include_usage") is True)
    _unsupported(data, "logit_bias", lambda v: v == {})
    stop = data.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a non-empty string or a list of them", param="stop")
    if len(stop) > MAX_STOP:
        raise bad_request(f"'stop' may hold at most {MAX_STOP} strings", param="stop")
    stop_ids = data.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) and t >= 0 for t in stop_ids):
        raise bad_request("'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    sampling = {
        "temperature": f.get("temperature", "number", 1.0, 0.0, 2.0),
        "top_p": f.get("top_p", "number", 1.0, 0.0, 1.0, lo_open=True),
        "top_k": f.get("top_k", "int", -1, -1, 1 << 20),
        "min_p": f.get("min_p", "number", 0.0, 0.0, 1.0),
        "repetition_penalty": f.get("repetition_penalty", "number", 1.0, 0.0, 2.0, lo_open=True),
        "presence_penalty": f.get("presence_penalty", "number", 0.0, -2.0, 2.0),
        "frequency_penalty": f.get("frequency_penalty", "number", 0.0, -2.0, 2.0),
        "ignore_eos": f.get("ignore_eos", "bool", False),
        "skip_special_tokens": f.get("skip_special_tokens", "bool", True),
        "stop": stop,
        "stop_token_ids": stop_ids,
    }
    return GenerateRequest(
        endpoint=endpoint,
        model=model,
        n=f.get("n", "int", 1, 1, 128),
        stream=stream,
        include_usage=include_usage,
        seed=f.get("seed", "int", None, 0, (1 << 63) - 1),
        sampling=sampling,
    )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_completion(data: dict) -> GenerateRequest:
    """Validate a /v1/completions body."""
    _check_unknown(data, COMPLETION_FIELDS)
    _unsupported(data, "echo", lambda v: v is False)
    _unsupported(data, "suffix", lambda v: v == "")
    req = _parse_common(data, "completions")
    f = _Fields(data)
    best_of = f.get("best_of", "int", req.n, 1, 128)
    if best_of != req.n:
        raise bad_request("'best_of' different from 'n' is not supported", param="best_of")
    req.max_tokens = f.get("max_tokens", "int", 16, 1)
    req.logprobs = f.get("logprobs", "int", None, 0, 20)
    req.prompts = _parse_prompts(data.get("prompt"))
    return req


def _parse_prompts(prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        prompts = prompt
    else:
        raise bad_request(
            "'prompt' must be a string, a list of token ids, or a non-empty list of either",
            param="prompt",
        )
    for p in prompts:
        if isinstance(p, list) and not (p and all(_is_int(t) and t >= 0 for t in p)):
            raise bad_request("token-id prompts must be non-empty lists of ids >= 0", "prompt")
        if isinstance(p, str) and not p:
            raise bad_request("'prompt' must not be empty", param="prompt")
    return prompts


def parse_chat(data: dict) -> GenerateRequest:
    """Validate a /v1/chat/completions body."""
    _check_unknown(data, CHAT_FIELDS)
    _unsupported(data, "tools", lambda v: v == [])
    _unsupported(data, "functions", lambda v: v == [])
    _unsupported(data, "tool_choice", lambda v: v in ("none", "auto"))
    _unsupported(data, "function_call", lambda v: v in ("none", "auto"))
    _unsupported(data, "response_format", lambda v: isinstance(v, dict) and v.get("type") == "text")
    _unsupported(data, "modalities", lambda v: v == ["text"])
    req = _parse_common(data, "chat")
    f = _Fields(data)
    max_tokens = f.get("max_tokens", "int", None, 1)
    req.max_tokens = f.get("max_completion_tokens", "int", max_tokens, 1)
    top = f.get("top_logprobs", "int", None, 0, 20)
    if f.get("logprobs", "bool", False):
        req.logprobs = top or 0
    elif top is not None:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    req.messages = parse_messages(data.get("messages"))
    return req


def parse_messages(messages) -> list[dict]:
    """Normalise chat messages to [{'role', 'content': str}]; 400 when malformed or empty."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of messages", param="messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"{where} must be an object with 'role' and 'content'", where)
        role = msg.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        if msg.get("tool_calls"):
            raise bad_request(f"{where}.tool_calls is not supported", f"{where}.tool_calls")
        # Chat templates know "system"; OpenAI's newer "developer" role means the same.
        role = "system" if role == "developer" else role
        out.append({"role": role, "content": _content_text(msg.get("content"), where)})
    return out


def _content_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise bad_request(f"{where}.content: only text parts are supported", where)
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content: a text part needs a 'text' string", where)
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{where}.content must be a string or a list of text parts", where)


def parse_tokenize(data: dict) -> tuple[str | None, list[dict] | None, bool]:
    """(prompt, messages, add_special_tokens) of a /tokenize body; exactly one of the first two."""
    _check_unknown(data, {"model", "prompt", "messages", "add_special_tokens"})
    f = _Fields(data)
    f.get("model", "str")
    add_special = f.get("add_special_tokens", "bool", True)
    if ("prompt" in data) == ("messages" in data):
        raise bad_request("send exactly one of 'prompt' (a string) or 'messages'")
    if "messages" in data:
        return None, parse_messages(data["messages"]), add_special
    prompt = data["prompt"]
    if not isinstance(prompt, str):
        raise bad_request(f"'prompt' must be a string, got {_json_type(prompt)}", "prompt")
    return prompt, None, add_special


def parse_detokenize(data: dict, vocab_size: int) -> list[int]:
    _check_unknown(data, {"model", "tokens"})
    _Fields(data).get("model", "str")
    tokens = data.get("tokens")
    if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t < vocab_size for t in tokens):
        raise bad_request(f"'tokens' must be a list of token ids in [0, {vocab_size})", "tokens")
    return tokens
