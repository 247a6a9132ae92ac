"""Request bodies of POST /v1/responses (OpenAI's Responses API): the top-level fields, checked
by the server's strict request model, and the input items, tools and text format, each checked
where the adapter reads it (appliance.server.responses_api.convert).

Fields marked (extension) are not in OpenAI's API. Fields this server cannot serve are refused
with a 400 naming them; fields that ask for nothing it could do differently are accepted and
ignored (docs/agents-codex.md has the table).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from appliance.server.schema.base import Allowed, Part, RequestModel, unsupported
from appliance.server.schema.requests import MAX_SEED, MAX_TOOLS, MODEL_DEFAULT, Stop

IGNORED = "Accepted and ignored."
MAX_METADATA = 16


# --- input items (validated one by one: each type has its model) ---------------------------
class TextPart(Part):
    """A text part of a message: input_text (user, system, developer) or output_text
    (assistant); "text" is taken as well."""

    type: Literal["input_text", "output_text", "text"]
    text: str


class RefusalPart(Part):
    type: Literal["refusal"]
    refusal: str


class ImagePart(Part):
    """An image of a user message: image_url is a data: URL (an http(s) URL under
    --allow-image-urls); file_id is refused (this server keeps no files)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = Field(
        None, description="Accepted; the model's processor decides the resolution."
    )


Content = Annotated[
    str | list[TextPart | RefusalPart],
    Allowed(
        'a string or a list of text parts ({"type": "input_text" or "output_text", "text": '
        "...}); only text parts are supported"
    ),
]
MessageContent = Annotated[
    str | list[TextPart | RefusalPart | ImagePart],
    Allowed(
        'a string or a list of text parts ({"type": "input_text" or "output_text", "text": '
        '...}) and, in a user message, image parts ({"type": "input_image", "image_url": '
        '"data:..."})'
    ),
]


class MessageItem(Part):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: MessageContent


class FunctionCallItem(Part):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    arguments: str


class FunctionCallOutputItem(Part):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: Content


class ReasoningText(Part):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Part):
    """The model's earlier reasoning; its text goes back to the template with the assistant
    turn it preceded. encrypted_content is ignored (this server writes none)."""

    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None


ITEMS = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}
"""The input item types this server reads, by their "type" (a message may leave it out)."""


# --- tools, tool choice, text format -------------------------------------------------------
class FunctionTool(Part):
    """A function tool in the Responses API's flat shape."""

    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(Part):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1)]


class TextFormat(Part):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Part):
    format: TextFormat | None = Field(
        None,
        description='{"type": "text"} (the default), {"type": "json_object"} or {"type": '
        '"json_schema", "name", "schema", "strict"}: the output is JSON that follows it, '
        "enforced token by token.",
    )
    verbosity: str | None = Field(None, description=IGNORED)


class ReasoningConfig(Part):
    effort: str | None = Field(None, description=IGNORED)
    summary: str | None = Field(None, description=IGNORED)


class ResponsesRequest(RequestModel):
    """POST /v1/responses."""

    model: str | None = Field(None, description="The served model's name; omitted = that one.")
    input: Annotated[
        str | list[dict[str, Any]],
        Allowed('a string or a list of input items (objects with a "type")'),
    ] = Field(
        description="A user message, or items: message, function_call, function_call_output, "
        "reasoning."
    )
    instructions: str | None = Field(
        None, description="A system message before the input (not carried to a next response)."
    )
    previous_response_id: str | None = Field(
        None, description="Continue a stored response: its input and output come first."
    )
    store: bool = Field(True, description="Keep the response for GET and previous_response_id.")
    stream: bool = Field(False, description="Send the Responses API's Server-Sent Events.")
    max_output_tokens: int | None = Field(
        None, ge=1, description=f"Most tokens to generate. {MODEL_DEFAULT} the rest of the context."
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0, description=MODEL_DEFAULT)
    top_p: float | None = Field(None, gt=0.0, le=1.0, description=MODEL_DEFAULT)
    stop: Stop | None = Field(
        None, description="(extension) The output ends before the first of these."
    )
    seed: int | None = Field(
        None, ge=0, le=MAX_SEED, description="(extension) Same seed, same tokens."
    )
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = Field(
        None,
        description='Function tools: {"type": "function", "name", "description", '
        '"parameters", "strict"}. Hosted tools are refused.',
    )
    tool_choice: (
        Annotated[
            Literal["none", "auto", "required"] | dict[str, Any],
            Allowed('"none", "auto", "required" or {"type": "function", "name": ...}'),
        ]
        | None
    ) = Field(None, description='"required" and a named function are enforced by grammar.')
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call.")
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = Field(None, description=IGNORED)
    include: list[str] | None = Field(None, description=IGNORED)
    metadata: dict[str, str] | None = Field(
        None, description=f"At most {MAX_METADATA} pairs, kept with the response and returned."
    )
    user: str | None = Field(None, description=IGNORED)
    safety_identifier: str | None = Field(None, description=IGNORED)
    prompt_cache_key: str | None = Field(None, description=IGNORED)
    prompt_cache_retention: str | None = Field(None, description=IGNORED)
    service_tier: str | None = Field(None, description=IGNORED)
    stream_options: dict[str, Any] | None = Field(None, description=IGNORED)
    truncation: unsupported(str, "disabled") = None
    background: unsupported(bool, False) = None
    conversation: unsupported(Any) = None
    prompt: unsupported(Any) = None
    top_logprobs: unsupported(int, 0) = None
    max_tool_calls: unsupported(int) = None
    context_management: unsupported(Any) = None
