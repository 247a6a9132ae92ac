"""StructuredOutput: what one request constrains its output to, independent of the library."""

from __future__ import annotations

import json
from dataclasses import dataclass

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
"""json_schema: `value` is the schema as JSON text; json_object: any JSON object (value "");
regex: the whole output matches `value`; choice: `value` is a JSON list of strings and the
output is exactly one of them; grammar: `value` is the grammar library's own syntax (Lark, as
llguidance reads it, where `%json {...}` embeds a JSON schema)."""


@dataclass(frozen=True)
class StructuredOutput:
    kind: str
    value: str = ""
    start_after: str | None = None
    """Text that opens the constrained part (a reasoning model's "</think>"): until the output
    holds it, tokens are free. None: constrained from the first token."""
    reasoning_open: str | None = None
    """Where the output may begin with reasoning (a template that knows "<think>" but did not
    open it): this text, as the first token, defers the grammar until `start_after`."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {', '.join(KINDS)}")
        if not isinstance(self.value, str):
            raise ValueError("structured output value must be text")

    @classmethod
    def json_schema(cls, schema: dict | str, **kw) -> StructuredOutput:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return cls("json_schema", text, **kw)

    @classmethod
    def choice(cls, options: list[str], **kw) -> StructuredOutput:
        return cls("choice", json.dumps(list(options)), **kw)

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "value": self.value,
            "start_after": self.start_after,
            "reasoning_open": self.reasoning_open,
        }

    @property
    def label(self) -> str:
        """The kind, for traces and metrics."""
        return self.kind
