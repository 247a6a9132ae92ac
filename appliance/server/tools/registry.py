"""The tool-call formats by name, and which one a model speaks."""

from __future__ import annotations

from appliance.server.tools.base import ToolParser
from appliance.server.tools.hermes import OPEN as HERMES_OPEN
from appliance.server.tools.hermes import HermesParser
from appliance.server.tools.llama3 import PYTHON_TAG, Llama3JsonParser
from appliance.server.tools.mistral import MARKER as MISTRAL_MARKER
from appliance.server.tools.mistral import MistralParser

PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser for parser in (HermesParser, Llama3JsonParser, MistralParser)
}
"""Every tool-call format the server parses, by the name the override flag takes."""

MODEL_TYPES = {
    "qwen2": "hermes",
    "qwen2_moe": "hermes",
    "qwen3": "hermes",
    "qwen3_moe": "hermes",
    "mistral": "mistral",
    "mixtral": "mistral",
}
"""config.json model_type -> format, for models whose chat template does not show it."""


def parser_for(
    chat_template: str | None, model_type: str | None, override: str | None = None
) -> str | None:
    """The name of the tool-call format a model writes, or None when it has none.

    `override` (a name in PARSERS) wins; then the chat template's markup (`<tool_call>`:
    hermes, `[TOOL_CALLS]`: mistral, `<|python_tag|>` or an "ipython" role: llama3_json); then
    the model type (a "llama" model only when its template mentions tools)."""
    if override is not None:
        if override not in PARSERS:
            raise ValueError(
                f"unknown tool parser {override!r}; choose one of: {', '.join(sorted(PARSERS))}"
            )
        return override
    template = chat_template or ""
    if HERMES_OPEN in template:
        return "hermes"
    if MISTRAL_MARKER in template:
        return "mistral"
    if PYTHON_TAG in template or "ipython" in template:
        return "llama3_json"
    kind = (model_type or "").lower()
    if kind in MODEL_TYPES:
        return MODEL_TYPES[kind]
    if kind == "llama" and "tools" in template:
        return "llama3_json"
    return None
