"""The types every tool-call parser shares and the one stream engine that turns a family's
markup scanner into content and call deltas, whole or piece by piece."""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from appliance.server.tools.grammar import Literal


@dataclass
class ToolCall:
    """One function call the model wrote."""

    id: str
    """"call_" and 24 random hex digits, made once per call."""
    name: str
    """The function's name, as the model wrote it."""
    arguments: str
    """The arguments as JSON text, exactly as they are sent to the client."""


@dataclass
class ParsedOutput:
    """A whole output split into what the user reads and the calls."""

    content: str
    """The text outside any call markup; whitespace next to a call is dropped."""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ContentDelta:
    """Text the client may show now."""

    text: str


@dataclass
class ToolCallDelta:
    """A piece of call `index`: its first delta carries id and name, later ones only arguments."""

    index: int
    id: str | None
    name: str | None
    arguments_fragment: str


Delta = ContentDelta | ToolCallDelta


def new_call_id() -> str:
    """A fresh call id: "call_" and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


def call_from_json(
    obj: Any, argument_keys: tuple[str, ...], needs_arguments: bool = False
) -> tuple[str, str] | None:
    """(name, arguments JSON text) from a decoded call object, or None when it is not one.

    A call is an object with a non-empty string "name" and its arguments under the first of
    `argument_keys` present: an object (dumped as JSON), or a string holding a JSON object
    (kept verbatim). No arguments key means no arguments ("{}"), or no call when
    `needs_arguments` (where bare JSON, not markup, marks a call)."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    args: Any = {}
    for key in argument_keys:
        if key in obj:
            args = obj[key]
            break
    else:
        if needs_arguments:
            return None
    if isinstance(args, dict):
        return name, json.dumps(args, ensure_ascii=False)
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except ValueError:
            return None
        return (name, args) if isinstance(decoded, dict) else None
    return None


def decode_json_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at text[pos] and the index just past it, or None when the text
    there is not (or not yet) a complete JSON value."""
    try:
        return json.JSONDecoder().raw_decode(text, pos)
    except ValueError:
        return None


def partial_marker_start(text: str, marker: str) -> int | None:
    """Where a proper prefix of `marker` ends `text`, so the text from there may yet become the
    marker; None when no suffix of the text can."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return len(text) - length
    return None


@dataclass
class Found:
    """Markup at text[start:end]: the calls it holds, or None when it is not a valid call (then
    the markup is content, verbatim)."""

    start: int
    end: int
    calls: list[tuple[str, str]] | None


@dataclass
class Pending:
    """Text from `start` on may be markup: hold it until more text (or the end) decides."""

    start: int


class Scanner(Protocol):
    """A family's markup finder, one per output (it may keep state between finds)."""

    def find(self, text: str, final: bool) -> Found | Pending | None:
        """The first markup in `text` (None: the text holds none and no more text can change
        that). A result other than Pending is final: the same for any longer text, and the
        scanner may advance its state on it. With final=True it never returns Pending."""
        ...


class ToolStream:
    """Feeds an output through a scanner: feed() takes each new piece of text and returns the
    deltas that are certain; finish() releases the rest. For every split of an output, the
    content deltas join to the whole parse's content and each call's fragments to its
    arguments."""

    def __init__(self, scanner: Scanner, drop_broken: bool = False) -> None:
        """drop_broken: markup that is not a whole call (cut by max_tokens) is dropped, not
        content: where a grammar forced the output to be calls."""
        self._scanner = scanner
        self._drop_broken = drop_broken
        self._buffer = ""
        self._held_space = ""
        self._after_call = False
        self._finished = False
        self.tool_calls: list[ToolCall] = []
        """The calls emitted so far, in index order."""

    def feed(self, text: str) -> list[Delta]:
        """The deltas that `text`, appended to the output so far, makes certain."""
        if self._finished:
            raise RuntimeError("feed() after finish(): a tool stream parses one output")
        self._buffer += text
        return self._run(final=False)

    def finish(self) -> list[Delta]:
        """The deltas the end of the output settles: held text and unterminated markup become
        content."""
        if self._finished:
            raise RuntimeError("finish() called twice on one tool stream")
        deltas = self._run(final=True)
        self._finished = True
        if self._held_space:
            deltas.append(ContentDelta(self._held_space))
            self._held_space = ""
        return _merge_content(deltas)

    def _run(self, final: bool) -> list[Delta]:
        deltas: list[Delta] = []
        while self._buffer:
            found = self._scanner.find(self._buffer, final)
            if found is None:
                self._text(self._buffer, deltas)
                self._buffer = ""
            elif isinstance(found, Pending):
                if final:
                    raise AssertionError("a scanner returned Pending at the end of the output")
                self._text(self._buffer[: found.start], deltas)
                self._buffer = self._buffer[found.start :]
                break
            else:
                if found.end <= 0:
                    raise AssertionError("a scanner found markup that consumes no text")
                if found.calls is None:
                    kept = found.start if self._drop_broken else found.end
                    self._text(self._buffer[:kept], deltas)
                else:
                    self._text(self._buffer[: found.start], deltas)
                    self._held_space = ""
                    self._after_call = True
                    for name, arguments in found.calls:
                        call = ToolCall(new_call_id(), name, arguments)
                        deltas.append(ToolCallDelta(len(self.tool_calls), call.id, name, arguments))
                        self.tool_calls.append(call)
                self._buffer = self._buffer[found.end :]
        return _merge_content(deltas)

    def _text(self, text: str, deltas: list[Delta]) -> None:
        """Content outside markup: whitespace right after a call is dropped, and trailing
        whitespace is held until it is known not to precede a call."""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        text = self._held_space + text
        body = text.rstrip()
        self._held_space = text[len(body) :]
        if body:
            deltas.append(ContentDelta(body))


def _merge_content(deltas: list[Delta]) -> list[Delta]:
    merged: list[Delta] = []
    for delta in deltas:
        if isinstance(delta, ContentDelta) and merged and isinstance(merged[-1], ContentDelta):
            merged[-1] = ContentDelta(merged[-1].text + delta.text)
        else:
            merged.append(delta)
    return merged


class ToolParser(ABC):
    """A model family's output format. Subclasses set `name` and make a scanner per output."""

    name: ClassVar[str]

    @abstractmethod
    def scanner(self) -> Scanner:
        """A fresh scanner for one output."""

    @abstractmethod
    def forced_grammar(self, functions: list[dict], parallel: bool, literal: Literal) -> str:
        """The grammar of an output that is nothing but calls of `functions` (OpenAI function
        definitions: name, parameters) in this family's markup; one call unless `parallel`."""

    def stream(self, drop_broken: bool = False) -> ToolStream:
        """A stream for one output, fed piece by piece (drop_broken: see ToolStream)."""
        return ToolStream(self.scanner(), drop_broken)

    def parse(self, text: str, drop_broken: bool = False) -> ParsedOutput:
        """A whole output's content and calls."""
        stream = self.stream(drop_broken)
        stream._buffer = text
        deltas = stream.finish()
        content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
        return ParsedOutput(content, list(stream.tool_calls))
