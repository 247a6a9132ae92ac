"""A Messages response built from the chat deltas of the one generation path (ChatStream's
{"reasoning_content"}, {"content"}, {"tool_calls"}): the stream's events and the whole message
alike, with no I/O, so the two cannot differ (tests/test_anthropic_events.py cuts outputs
every way and checks that the events assemble to the message).

Blocks follow the output's order: a thinking block for reasoning, a text block for content, a
tool_use block per call; a delta of another kind closes the open block. A thinking block ends
with a signature_delta: a digest of its text (not an attestation; signatures sent back are
ignored). Usage follows Anthropic's split: input_tokens are the prompt tokens the prefix cache
did not hold, cache_read_input_tokens those it held.
"""

from __future__ import annotations

import hashlib
import json

Event = tuple[str, dict]
"""(event type, data): one SSE event, `event: <type>` and `data: <json>`."""
CALL_PREFIX, TOOL_PREFIX = "call_", "toolu_"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    """Anthropic's usage: the prompt split into what was computed and what the cache held."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def stop_reason(finish_reason: str | None, stopped_by, has_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished output: `stopped_by` is the engine's
    stop_reason (the stop string that ended it, a stop token id, or None)."""
    if finish_reason == "length":
        return "max_tokens", None
    if has_calls:
        return "tool_use", None
    if isinstance(stopped_by, str):
        return "stop_sequence", stopped_by
    return "end_turn", None


def signature(thinking: str) -> str:
    """A thinking block's signature: the SHA-256 of its text, hex."""
    return hashlib.sha256(thinking.encode("utf-8", "surrogatepass")).hexdigest()


def tool_use_id(call_id: str) -> str:
    """A parser's call id ("call_<hex>") as a tool_use id ("toolu_<hex>")."""
    return TOOL_PREFIX + call_id.removeprefix(CALL_PREFIX)


class MessageEvents:
    """One message: `start()`, then `feed()` each list of chat deltas, then `finish()`; each
    returns the events to send. `content` holds the blocks so far (whole once finished) and
    `message()` the whole response body."""

    def __init__(self, message_id: str, model: str) -> None:
        self.id = message_id
        self.model = model
        self.content: list[dict] = []
        self.has_calls = False
        self.stop: tuple[str | None, str | None] = (None, None)
        self.usage: dict = usage(0, 0, 0)
        self._open: dict | None = None
        self._json = ""  # the open tool_use block's argument text so far

    def message(self) -> dict:
        """The message body (with the content so far)."""
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content,
            "stop_reason": self.stop[0],
            "stop_sequence": self.stop[1],
            "usage": self.usage,
        }

    def start(self, usage_: dict) -> list[Event]:
        """message_start (an empty message with the prompt's usage so far), then a ping."""
        self.usage = usage_
        return [
            (
                "message_start",
                {"type": "message_start", "message": {**self.message(), "content": []}},
            ),
            ("ping", {"type": "ping"}),
        ]

    def feed(self, deltas: list[dict]) -> list[Event]:
        events: list[Event] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                events += self._append("thinking", delta["reasoning_content"])
            if delta.get("content"):
                events += self._append("text", delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
        return events

    def finish(self, stop: tuple[str, str | None], usage_: dict) -> list[Event]:
        """Close the open block; message_delta (stop reason, final usage), message_stop."""
        self.stop, self.usage = stop, usage_
        delta = {"stop_reason": stop[0], "stop_sequence": stop[1]}
        return self._close() + [
            ("message_delta", {"type": "message_delta", "delta": delta, "usage": usage_}),
            ("message_stop", {"type": "message_stop"}),
        ]

    # --- blocks -----------------------------------------------------------------------------
    def _append(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            empty = {"type": "text", "text": ""}
            if kind == "thinking":
                empty = {"type": "thinking", "thinking": "", "signature": ""}
            events += self._close() + self._begin(empty)
        self._open[kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        return events + [self._delta(delta)]

    def _call(self, call: dict) -> list[Event]:
        events: list[Event] = []
        function = call.get("function") or {}
        if call.get("id") is not None:  # a new call: its first delta names it
            self.has_calls = True
            block = {"type": "tool_use", "id": tool_use_id(call["id"]), "name": function["name"]}
            events += self._close() + self._begin({**block, "input": {}})
        fragment = function.get("arguments") or ""
        if fragment and self._open is not None and self._open["type"] == "tool_use":
            self._json += fragment
            events.append(self._delta({"type": "input_json_delta", "partial_json": fragment}))
        return events

    def _begin(self, block: dict) -> list[Event]:
        self._open = block
        self.content.append(block)
        start = {"type": "content_block_start", "index": self._index, "content_block": dict(block)}
        return [("content_block_start", start)]

    def _delta(self, delta: dict) -> Event:
        data = {"type": "content_block_delta", "index": self._index, "delta": delta}
        return ("content_block_delta", data)

    def _close(self) -> list[Event]:
        block, self._open = self._open, None
        if block is None:
            return []
        events: list[Event] = []
        if block["type"] == "thinking":
            block["signature"] = signature(block["thinking"])
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append(self._delta(delta))
        elif block["type"] == "tool_use":
            block["input"] = json.loads(self._json) if self._json else {}
            self._json = ""
        stop = {"type": "content_block_stop", "index": self._index}
        return events + [("content_block_stop", stop)]

    @property
    def _index(self) -> int:
        return len(self.content) - 1
