"""Hermes-style calls (Qwen2.5, Qwen3): `<tool_call>\n{"name": ..., "arguments": {...}}\n
</tool_call>`, any number of them, with content before, between or after."""

from __future__ import annotations

import json

from appliance.server.tools.base import (
    Found,
    Pending,
    ToolParser,
    call_from_json,
    partial_marker_start,
)
from appliance.server.tools.grammar import Literal, calls_grammar

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
ARGUMENT_KEYS = ("arguments", "parameters")


class HermesScanner:
    """Finds `<tool_call>...</tool_call>` blocks; one whose body is not a call object is
    content, and so is an opening tag never closed."""

    def find(self, text: str, final: bool) -> Found | Pending | None:
        start = text.find(OPEN)
        if start < 0:
            partial = None if final else partial_marker_start(text, OPEN)
            return None if partial is None else Pending(partial)
        close = text.find(CLOSE, start + len(OPEN))
        if close < 0:
            return Found(start, len(text), None) if final else Pending(start)
        end = close + len(CLOSE)
        try:
            call = call_from_json(json.loads(text[start + len(OPEN) : close]), ARGUMENT_KEYS)
        except ValueError:
            call = None
        return Found(start, end, None if call is None else [call])


class HermesParser(ToolParser):
    """Qwen2.5 / Qwen3 and other Hermes-format models."""

    name = "hermes"

    def scanner(self) -> HermesScanner:
        return HermesScanner()

    def forced_grammar(self, functions: list[dict], parallel: bool, literal: Literal) -> str:
        return calls_grammar(
            functions, parallel, "arguments", OPEN + "\n", "\n" + CLOSE, "\n", literal
        )
