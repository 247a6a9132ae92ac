"""Tool calls in generated chat text: per model family, whole outputs and streams of deltas."""

from __future__ import annotations

from appliance.server.tools.base import (
    ContentDelta,
    Delta,
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    ToolStream,
)
from appliance.server.tools.hermes import HermesParser
from appliance.server.tools.llama3 import Llama3JsonParser
from appliance.server.tools.mistral import MistralParser
from appliance.server.tools.registry import PARSERS, parser_for

__all__ = [
    "PARSERS",
    "ContentDelta",
    "Delta",
    "HermesParser",
    "Llama3JsonParser",
    "MistralParser",
    "ParsedOutput",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "ToolStream",
    "parser_for",
]
