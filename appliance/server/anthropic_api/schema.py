"""Request bodies of Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

Top-level fields this server does not know are refused (as Anthropic refuses them); keys
inside blocks it does not read (`cache_control`, `citations`) are ignored. Fields that ask for
what the appliance cannot do (server tools' containers, MCP servers) are a 400 when set.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from appliance.server.schema.base import Allowed, Part, RequestModel, unsupported
from appliance.server.schema.requests import MAX_STOP, MAX_TOOLS, MAX_TOP_K, NonEmptyStr


class TextBlock(Part):
    type: Literal["text"]
    text: str


class Base64Source(Part):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(description="The image's bytes, base64-encoded.")


class URLSource(Part):
    type: Literal["url"]
    url: NonEmptyStr = Field(description="Fetched only where the server runs --allow-image-urls.")


class ImageBlock(Part):
    type: Literal["image"]
    source: Annotated[
        Base64Source | URLSource,
        Allowed(
            '{"type": "base64", "media_type": "image/jpeg", "image/png", "image/gif" or '
            '"image/webp", "data": ...} or {"type": "url", "url": ...}'
        ),
    ]


class ToolUseBlock(Part):
    type: Literal["tool_use"]
    id: NonEmptyStr
    name: NonEmptyStr
    input: dict[str, Any] = Field(description="The call's arguments, an object.")


class ToolResultBlock(Part):
    type: Literal["tool_result"]
    tool_use_id: NonEmptyStr
    content: Annotated[str | list[TextBlock], Allowed("a string or a list of text blocks")] = ""
    is_error: bool = Field(False, description='true: the text reaches the model led by "Error: ".')


class ThinkingBlock(Part):
    type: Literal["thinking"]
    thinking: str
    signature: str = Field("", description="Accepted and ignored.")


class RedactedThinkingBlock(Part):
    type: Literal["redacted_thinking"]
    data: str = Field("", description="Ignored: the block does not reach the model.")


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)
Content = Annotated[
    str | list[Block],
    Allowed(
        "a string or a list of text, image, tool_use, tool_result, thinking or "
        "redacted_thinking blocks (documents are not supported)"
    ),
]


class Message(Part):
    role: Literal["user", "assistant"]
    content: Content


class Tool(Part):
    name: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        description="Letters, digits, '_' and '-'."
    )
    description: str | None = None
    input_schema: dict[str, Any] = Field(description='A JSON Schema of "type": "object".')
    type: Literal["custom"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tool(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in (None, "custom"):
            raise PydanticCustomError(
                "server_tool",
                "is a server tool (type {kind}): only client tools, with an input_schema, are "
                "supported by this server",
                {"kind": json.dumps(kind)},
            )
        return data


Tools = Annotated[
    list[Tool],
    Field(max_length=MAX_TOOLS),
    Allowed(
        f'a list of at most {MAX_TOOLS} client tools, each {{"name", "description", '
        '"input_schema"}} with a name of letters, digits, "_" or "-" (server tools such as '
        "web search are not supported)"
    ),
]


class ToolChoiceAuto(Part):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(Part):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(Part):
    type: Literal["tool"]
    name: NonEmptyStr
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(Part):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
    Allowed('{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} or {"type": "none"}'),
]


class ThinkingEnabled(Part):
    type: Literal["enabled"]
    budget_tokens: int = Field(
        ge=1, description="Accepted; max_tokens bounds thinking and answer together."
    )


class ThinkingDisabled(Part):
    type: Literal["disabled"]


class ThinkingAdaptive(Part):
    type: Literal["adaptive"]


Thinking = Annotated[
    ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive,
    Allowed(
        '{"type": "enabled", "budget_tokens": N}, {"type": "adaptive"} or {"type": "disabled"}'
    ),
]


class JsonFormat(Part):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON Schema to follow.")


class OutputConfig(Part):
    format: JsonFormat | None = Field(None, description="The answer's text follows the schema.")
    effort: str | None = Field(None, description="Accepted and ignored.")


System = Annotated[str | list[TextBlock], Allowed("a string or a list of text blocks")]


class CountTokensRequest(RequestModel):
    """POST /v1/messages/count_tokens: what the prompt is made of."""

    model: NonEmptyStr = Field(description="The served model's name or a --model-alias NAME.")
    messages: Annotated[list[Message], Field(min_length=1), Allowed("a non-empty list of messages")]
    system: System | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = Field(
        None, description="enabled/adaptive turn the chat template's enable_thinking on."
    )
    output_config: OutputConfig | None = None
    context_management: Any = Field(None, description="Accepted and ignored.")
    cache_control: Any = Field(None, description="Accepted and ignored (the prefix cache is on).")
    mcp_servers: unsupported(Any, []) = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1, description="Most tokens to generate, thinking included.")
    stream: bool = Field(False, description="Send the Messages SSE events.")
    stop_sequences: (
        Annotated[
            list[NonEmptyStr],
            Field(max_length=MAX_STOP),
            Allowed(f"a list of at most {MAX_STOP} non-empty strings"),
        ]
        | None
    ) = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K)
    metadata: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, description="Accepted and ignored.")
    speed: str | None = Field(None, description="Accepted and ignored.")
    inference_geo: str | None = Field(None, description="Accepted and ignored.")
    container: unsupported(Any) = None
