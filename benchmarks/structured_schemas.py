"""The constraints scripts/bench_structured.py measures with, and the independent check of what
the constrained requests wrote: the record-array schema and an agent's forced tool call (no
output can complete either before max_tokens, so both arms produce equal lengths), their text as
regular expressions, and the wide schema whose compile time is measured."""

from __future__ import annotations

import regex

MIN_RECORDS = 1000
"""Far more records than max_tokens can hold: the grammar never completes in the benchmark."""
MAX_NAME = 12
MAX_ID = 99_999
TAGS = ("red", "green", "blue")

RECORDS_SCHEMA = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": MIN_RECORDS,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
                    "name": {"type": "string", "maxLength": MAX_NAME},
                    "tag": {"enum": list(TAGS)},
                    "ok": {"type": "boolean"},
                },
                "required": ["id", "name", "tag", "ok"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["records"],
    "additionalProperties": False,
}

_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'  # one character of a JSON string
_ID = rf"(?:0|[1-9][0-9]{{0,{len(str(MAX_ID)) - 1}}})"
_RECORD = (
    rf'\{{"id": {_ID}, "name": "{_CHAR}{{0,{MAX_NAME}}}", '
    rf'"tag": "(?:{"|".join(TAGS)})", "ok": (?:true|false)\}}'
)
RECORDS_JSON = regex.compile(rf'\{{"records": \[(?:{_RECORD}(?:, {_RECORD})*)?\]\}}')
"""RECORDS_SCHEMA's instances as json.dumps writes them (", " and ": ", properties in schema
order, the engine's JSON style), minItems aside. Written by hand from the schema: it does not
ask the grammar library what is valid. The largest id is checked by its digit count only."""


WRITE_FILES = {
    "name": "write_files",
    "description": "Write files into the workspace.",
    "parameters": {
        "type": "object",
        "properties": {
            "files": {
                "type": "array",
                "minItems": MIN_RECORDS,
                "items": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["files"],
        "additionalProperties": False,
    },
}
"""A coding agent's tool, forced by name (tool_choice): free-length strings, as agents' tool
arguments are, where the record schema's strings are bounded."""
_FILE = rf'\{{"path": "{_CHAR}*", "content": "{_CHAR}*"\}}'
TOOL_CALL_TEXT = regex.compile(
    rf'<tool_call>\n\{{"name": "write_files", "arguments": \{{"files": '
    rf"\[(?:{_FILE}(?:, {_FILE})*)?\]\}}\}}\n</tool_call>"
)
"""The forced call in Hermes markup (appliance/server/tools/hermes.py), minItems aside; written
by hand from the tool's schema."""
PATTERNS = {"records": RECORDS_JSON, "tool": TOOL_CALL_TEXT}
"""Each constraint of the benchmark (--schema) and the text it allows."""


def is_valid_prefix(text: str, schema: str = "records") -> bool:
    """True when `text` is what the constraint `schema` allows or the beginning of it."""
    return PATTERNS[schema].fullmatch(text, partial=True) is not None


def wide_schema(num_properties: int = 50) -> dict:
    """An object of `num_properties` required properties of ten kinds in turn: bounded strings,
    bounded integers, enums, booleans, bounded numbers, patterns, arrays, nested objects,
    anyOf with null, date-times."""
    kinds = [
        lambda i: {"type": "string", "maxLength": 8 + i % 24},
        lambda i: {"type": "integer", "minimum": -i, "maximum": 1000 * (i + 1)},
        lambda i: {"enum": [f"option_{i}_{k}" for k in range(3 + i % 4)]},
        lambda i: {"type": "boolean"},
        lambda i: {"type": "number", "minimum": 0, "maximum": i + 1},
        lambda i: {"type": "string", "pattern": "^[a-z]{2,6}-[0-9]{3}$"},
        lambda i: {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
        lambda i: {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "label": {"type": "string"}},
            "required": ["x", "label"],
            "additionalProperties": False,
        },
        lambda i: {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
        lambda i: {"type": "string", "format": "date-time"},
    ]
    properties = {f"field_{i:02d}": kinds[i % len(kinds)](i) for i in range(num_properties)}
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
