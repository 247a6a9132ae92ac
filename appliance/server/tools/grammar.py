"""Forced tool calls (tool_choice "required" or a named function) as a grammar: the output is
a call in the model family's markup, or several where parallel calls are allowed, and each
call's arguments follow its function's parameters schema. The grammar is llguidance's Lark
(engine.structured), with each call's JSON embedded as `%json {schema}`."""

from __future__ import annotations

import json
from collections.abc import Callable

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""The calls' JSON as json.dumps writes it (as response_format's JSON is)."""

Literal = Callable[[str], str]
"""Markup text -> its Lark terminal: a quoted string, or `<[id]>` where the tokenizer holds
the markup as one special token (which no text spelling matches)."""


def quoted(text: str) -> str:
    return json.dumps(text)


def arguments_schema(parameters: dict | None) -> dict:
    """The schema a call's arguments follow: the function's parameters, an object."""
    return {"type": "object", **(parameters or {})}


def call_schema(functions: list[dict], argument_key: str) -> dict:
    """One call object of any of `functions`: {"name": <its name>, argument_key: <args>}."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                argument_key: arguments_schema(f.get("parameters")),
            },
            "required": ["name", argument_key],
            "additionalProperties": False,
        }
        for f in functions
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def json_rule(schema: dict) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE})


def calls_grammar(
    functions: list[dict],
    parallel: bool,
    argument_key: str,
    before: str = "",
    after: str = "",
    separator: str = "",
    literal: Literal = quoted,
) -> str:
    """`before call after`, repeated with `separator` between calls when parallel."""
    parts = [literal(before) if before else "", "body", literal(after) if after else ""]
    call = " ".join(p for p in parts if p)
    repeat = f" ({literal(separator) + ' ' if separator else ''}call)*" if parallel else ""
    return (
        f"start: call{repeat}\n"
        f"call: {call}\n"
        f"body: {json_rule(call_schema(functions, argument_key))}\n"
    )
