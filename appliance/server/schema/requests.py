"""Request bodies of /v1/completions, /v1/chat/completions, /tokenize and /detokenize.

The server validates every body through these models (appliance.server.protocol) and
/openapi.json is generated from them, so a field, its range and its default are written once.
Fields marked (extension) are not in OpenAI's API; vLLM accepts the same names.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from appliance.server.schema.base import Allowed, Part, RequestModel, unsupported
from engine.sampling_params import MAX_CACHE_SALT, SamplingParams

Role = Literal["system", "developer", "user", "assistant", "tool"]
MAX_N = 128
MAX_STOP = 16
MAX_LOGPROBS = 20
MAX_SEED = (1 << 63) - 1
MAX_TOP_K = 1 << 20
MAX_TOOLS = 128
MODEL_DEFAULT = "Omitted = the model's default (generation_config.json), else"


def _ours(name: str) -> str:
    """The server's own default of a SamplingParams field, for a description."""
    return f"{MODEL_DEFAULT} {getattr(SamplingParams, name):g}."


NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenId = Annotated[int, Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class StreamOptions(Part):
    include_usage: bool = Field(False, description="End the stream with a chunk holding usage.")


class TextPart(Part):
    type: Literal["text"]
    text: str


class ImageURL(Part):
    url: NonEmptyStr = Field(
        description="A data: URL (data:image/png;base64,...); an http(s) URL where the server "
        "runs with --allow-image-urls."
    )
    detail: Literal["auto", "low", "high"] | None = Field(
        None, description="Accepted; the model's processor decides the resolution."
    )


class ImagePart(Part):
    type: Literal["image_url"]
    image_url: ImageURL


class FunctionCall(Part):
    name: NonEmptyStr
    arguments: str = Field(description="The arguments, a JSON object as text.")


class ToolCallPart(Part):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Part):
    role: Role = Field(description='"developer" is read as "system".')
    content: Annotated[
        str | list[TextPart | ImagePart] | None,
        Allowed(
            'a string or a list of text parts ({"type": "text", "text": "..."}) and, in a user '
            'message, image parts ({"type": "image_url", "image_url": {"url": "data:..."}})'
        ),
    ] = Field(
        None,
        description="May be null only in an assistant message with tool_calls. Image parts "
        "reach a model that reads images.",
    )
    name: str | None = None
    tool_calls: list[ToolCallPart] | None = Field(
        None, description="An assistant message's calls, as the server returned them."
    )
    tool_call_id: str | None = Field(None, description="A tool message: the call it answers.")


class FunctionDef(Part):
    name: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="Letters, digits, '_', '.' and '-'."
    )
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON Schema object.")
    strict: bool | None = None


class ToolDef(Part):
    type: Literal["function"]
    function: FunctionDef


class JsonSchemaFormat(Part):
    name: Annotated[str, Field(min_length=1, max_length=64)] = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON Schema to follow.")
    strict: bool | None = Field(None, description="Accepted; the schema is always enforced.")


class ResponseFormat(Part):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(None, description='With type "json_schema".')


class FunctionName(Part):
    name: NonEmptyStr


class NamedToolChoice(Part):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Annotated[
    Literal["none", "auto", "required"] | NamedToolChoice,
    Allowed('"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'),
]


Messages = Annotated[
    list[ChatMessage], Field(min_length=1), Allowed("a non-empty list of messages")
]
Stop = Annotated[
    NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP)],
    Allowed(f"a non-empty string or a list of at most {MAX_STOP} of them"),
]
Prompt = Annotated[
    NonEmptyStr | TokenIds | Annotated[list[NonEmptyStr | TokenIds], Field(min_length=1)],
    Allowed(
        "a string, a list of token ids (integers >= 0), or a non-empty list of either, "
        "none of them empty"
    ),
]


class SamplingRequest(RequestModel):
    """The fields both generation endpoints take."""

    model: str | None = Field(None, description="The served model's name; omitted = that one.")
    n: int = Field(
        1, ge=1, le=MAX_N, description="Choices per prompt (the server caps prompts x n)."
    )
    stream: bool = Field(False, description="Send Server-Sent Events, ending with [DONE].")
    stream_options: StreamOptions | None = None
    stop: Stop | None = Field(None, description="The output ends before the first of these.")
    stop_token_ids: Annotated[list[TokenId], Allowed("a list of token ids")] | None = Field(
        None, description="(extension) Token ids that end the output, besides end-of-sequence."
    )
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description=f"0 = greedy. {_ours('temperature')}"
    )
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, description=f"Nucleus sampling mass. {_ours('top_p')}"
    )
    top_k: int | None = Field(
        None,
        ge=-1,
        le=MAX_TOP_K,
        description=f"(extension) Keep the k likeliest tokens; -1 = all. {_ours('top_k')}",
    )
    min_p: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="(extension) Drop tokens below min_p x the likeliest token's probability.",
    )
    repetition_penalty: float | None = Field(
        None,
        gt=0.0,
        le=2.0,
        description="(extension) > 1 discourages tokens already in the prompt or the output. "
        + _ours("repetition_penalty"),
    )
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(
        None, ge=0, le=MAX_SEED, description="Same seed, same tokens; choice i uses seed + i."
    )
    ignore_eos: bool = Field(
        False, description="(extension) Keep generating past end-of-sequence (for benchmarks)."
    )
    skip_special_tokens: bool = Field(
        True, description="(extension) Leave special tokens out of the text."
    )
    logit_bias: unsupported(dict[str, float], {}) = None
    user: str | None = Field(None, description="Accepted and ignored.")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored.")
    store: bool | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, description="Accepted and ignored.")
    parallel_tool_calls: bool | None = Field(
        None, description="false: at most one tool call per choice (default true)."
    )
    response_format: ResponseFormat | None = Field(
        None,
        description='{"type": "json_object"} or {"type": "json_schema", "json_schema": '
        '{"name", "schema", "strict"}}: the output is JSON that follows it, enforced token '
        "by token.",
    )
    regex: str | None = Field(
        None, description="(extension) The output matches this regular expression."
    )
    choice: Annotated[list[NonEmptyStr], Field(min_length=1, max_length=1024)] | None = Field(
        None, description="(extension) The output is exactly one of these strings."
    )
    grammar: str | None = Field(
        None,
        description="(extension) The output follows this grammar, in llguidance's Lark "
        "syntax (`%json {...}` embeds a JSON schema).",
    )
    cache_salt: Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT)] | None = Field(
        None,
        description="(extension, as in vLLM) Reuse only the prefix-cache entries of requests "
        "with the same salt, so other users cannot tell from response times what was sent.",
    )


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: Prompt = Field(description="Each prompt gets n choices.")
    max_tokens: int | None = Field(
        None, ge=1, description=f"Most tokens to generate per choice. {_ours('max_tokens')}"
    )
    logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="Return this many top alternatives per token."
    )
    echo: unsupported(bool, False) = False
    suffix: unsupported(str, "") = None
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="Only equal to n is supported.")


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: Messages
    max_tokens: int | None = Field(
        None,
        ge=1,
        description=f"Most tokens per choice. {MODEL_DEFAULT} the rest of the context.",
    )
    max_completion_tokens: int | None = Field(None, ge=1, description="Overrides max_tokens.")
    logprobs: bool = Field(False, description="Return each output token's logprob.")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="Alternatives per token; needs logprobs."
    )
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = Field(
        None, description="Functions the model may call; the chat template lists them."
    )
    tool_choice: ToolChoice | None = Field(
        None,
        description='"auto" (the default with tools): the calls the model writes are parsed; '
        '"none": the output is content; "required": at least one call; a named function: a '
        "call of it. The last two are enforced by grammar, arguments following the function's "
        "parameters schema.",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description='(extension) More template variables, e.g. {"enable_thinking": false}.'
    )
    functions: unsupported(Any, []) = None
    function_call: unsupported(Any, "none", "auto") = None
    modalities: unsupported(Any, ["text"]) = None


class TokenizeRequest(RequestModel):
    """POST /tokenize: exactly one of prompt and messages."""

    model: str | None = None
    prompt: str | None = Field(None, description="Text, encoded as-is.")
    messages: Messages | None = Field(None, description="Rendered with the chat template.")
    add_special_tokens: bool = Field(True, description="For prompt: add BOS and the like.")


class DetokenizeRequest(RequestModel):
    """POST /detokenize."""

    model: str | None = None
    tokens: Annotated[list[TokenId], Allowed("a list of token ids")]
