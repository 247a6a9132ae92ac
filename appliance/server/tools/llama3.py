"""Llama 3.1+ JSON calls: the output is `{"name": ..., "parameters": {...}}` (or "arguments"),
optionally after `<|python_tag|>`, several joined by `;`."""

from __future__ import annotations

from appliance.server.tools.base import Found, Pending, ToolParser, call_from_json, decode_json_at
from appliance.server.tools.grammar import Literal, calls_grammar

PYTHON_TAG = "<|python_tag|>"
ARGUMENT_KEYS = ("parameters", "arguments")


class Llama3JsonScanner:
    """A call is an object with "name" and "parameters" (or "arguments"); a JSON answer such
    as {"name": "Bob"} stays content. Calls come only at the start of the output (after
    whitespace), then each after `;` or directly after the previous one. From the first text
    that is not a call on, the rest of the output is content, verbatim. A call's JSON is held
    until its closing brace; JSON that never completes is content at the end."""

    def __init__(self) -> None:
        self._state = "start"  # "start" | "after_call" | "content"

    def find(self, text: str, final: bool) -> Found | Pending | None:
        if self._state == "content":
            return None
        first = len(text) - len(text.lstrip())
        if first == len(text):
            return None if final else Pending(0)
        if self._state == "start":
            if text.startswith(PYTHON_TAG, first):
                brace = _skip_space(text, first + len(PYTHON_TAG))
                if brace == len(text):
                    return self._to_content() if final else Pending(first)
                if text[brace] != "{":
                    return self._to_content()
                return self._call(text, first, brace, final)
            if not final and PYTHON_TAG.startswith(text[first:]):
                return Pending(first)
            if text[first] == "{":
                return self._call(text, first, first, final)
            return self._to_content()
        brace = first
        if text[brace] == ";":
            brace = _skip_space(text, brace + 1)
            if brace == len(text):
                return self._to_content() if final else Pending(0)
        if text[brace] != "{":
            return self._to_content()
        return self._call(text, 0, brace, final)

    def _call(self, text: str, start: int, brace: int, final: bool) -> Found | Pending | None:
        decoded = decode_json_at(text, brace)
        if decoded is None:
            return self._to_content() if final else Pending(start)
        call = call_from_json(decoded[0], ARGUMENT_KEYS, needs_arguments=True)
        if call is None:
            return self._to_content()
        self._state = "after_call"
        return Found(start, decoded[1], [call])

    def _to_content(self) -> None:
        self._state = "content"
        return None


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class Llama3JsonParser(ToolParser):
    """Llama 3.1, 3.2 and 3.3 JSON tool calls."""

    name = "llama3_json"

    def scanner(self) -> Llama3JsonScanner:
        return Llama3JsonScanner()

    def forced_grammar(self, functions: list[dict], parallel: bool, literal: Literal) -> str:
        return calls_grammar(functions, parallel, "parameters", separator="; ", literal=literal)
