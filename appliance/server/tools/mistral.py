"""Mistral calls: `[TOOL_CALLS]` and a JSON array of `{"name": ..., "arguments": {...}}`
(a single object is taken too), or the newer `[TOOL_CALLS]name[ARGS]{...}`; content may come
before."""

from __future__ import annotations

import json
import re

from appliance.server.tools.base import (
    Found,
    Pending,
    ToolParser,
    call_from_json,
    decode_json_at,
    partial_marker_start,
)
from appliance.server.tools.grammar import Literal, call_schema, json_rule

MARKER = "[TOOL_CALLS]"
ARGS_MARKER = "[ARGS]"
ARGUMENT_KEYS = ("arguments", "parameters")
NAME = re.compile(r"[A-Za-z0-9_.\-]+")


class MistralScanner:
    """Finds `[TOOL_CALLS]` and the calls after it. JSON that is not a list of calls is content,
    verbatim, and so is JSON that never completes."""

    def find(self, text: str, final: bool) -> Found | Pending | None:
        start = text.find(MARKER)
        if start < 0:
            partial = None if final else partial_marker_start(text, MARKER)
            return None if partial is None else Pending(partial)
        body = start + len(MARKER)
        while body < len(text) and text[body].isspace():
            body += 1
        if body == len(text):
            return Found(start, len(text), None) if final else Pending(start)
        if text[body] in "[{":
            decoded = decode_json_at(text, body)
            if decoded is None:
                return Found(start, len(text), None) if final else Pending(start)
            value, end = decoded
            items = value if isinstance(value, list) else [value]
            calls = [call_from_json(item, ARGUMENT_KEYS) for item in items]
            if not calls or None in calls:
                return Found(start, end, None)
            return Found(start, end, calls)  # type: ignore[arg-type]
        return self._named_call(text, start, body, final)

    def _named_call(self, text: str, start: int, body: int, final: bool) -> Found | Pending:
        """`name[ARGS]{...}`: text that cannot become one leaves the marker as content."""
        name = NAME.match(text, body)
        if name is None:
            return Found(start, body, None)
        rest = text[name.end() :]
        if not rest or (not rest.startswith(ARGS_MARKER) and ARGS_MARKER.startswith(rest)):
            return Found(start, len(text), None) if final else Pending(start)
        if not rest.startswith(ARGS_MARKER):
            return Found(start, body, None)
        brace = name.end() + len(ARGS_MARKER)
        if brace == len(text):
            return Found(start, len(text), None) if final else Pending(start)
        if text[brace] != "{":
            return Found(start, body, None)
        decoded = decode_json_at(text, brace)
        if decoded is None:
            return Found(start, len(text), None) if final else Pending(start)
        arguments = json.dumps(decoded[0], ensure_ascii=False)
        return Found(start, decoded[1], [(name.group(), arguments)])


class MistralParser(ToolParser):
    """Mistral, Mixtral and other models with the `[TOOL_CALLS]` token."""

    name = "mistral"

    def scanner(self) -> MistralScanner:
        return MistralScanner()

    def forced_grammar(self, functions: list[dict], parallel: bool, literal: Literal) -> str:
        calls = {"type": "array", "items": call_schema(functions, "arguments"), "minItems": 1}
        if not parallel:
            calls["maxItems"] = 1
        return f"start: {literal(MARKER)} body\nbody: {json_rule(calls)}\n"
