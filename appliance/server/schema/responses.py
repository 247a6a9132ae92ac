"""Response bodies: completions, chat completions and their stream chunks, logprobs, usage,
models, tokenize, detokenize, health and the error envelope.

They document what the server sends (/openapi.json) and tests validate every body against them.
The per-token path does not build them: appliance.server.responses writes the same keys from
pre-serialised parts, which is cheaper than constructing and dumping a model per chunk.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from appliance.server.schema.base import ResponseModel

FinishReason = Literal["stop", "length", "abort", "tool_calls"]
StopReason = str | int | None
"""The stop string or stop token id that ended a choice; null for end-of-sequence or length."""


class ErrorBody(ResponseModel):
    message: str = Field(description="What went wrong and what to change.")
    type: str = Field(description="invalid_request_error, rate_limit_error, ...")
    param: str | None = Field(description="The request parameter at fault, as a JSON path.")
    code: str | None = Field(description="A stable code: context_length_exceeded, ...")


class ErrorResponse(ResponseModel):
    """Every error, and the last event of a stream that fails after it started."""

    error: ErrorBody


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = Field(
        description="Prompt tokens whose KV the prefix cache held, so they were not computed "
        "again (per prompt, the fewest any of its n choices found)."
    )


class Usage(ResponseModel):
    prompt_tokens: int = Field(description="Each prompt counted once, whatever n.")
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(ResponseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(ResponseModel):
    content: list[TokenLogprob]


class _Envelope(ResponseModel):
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: None = None


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: StopReason


class CompletionResponse(_Envelope):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage


class FunctionCallOut(ResponseModel):
    name: str
    arguments: str = Field(description="A JSON object, as text.")


class ToolCallOut(ResponseModel):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(ResponseModel):
    role: Literal["assistant"]
    content: str | None = Field(description="null when the answer is only tool calls.")
    reasoning_content: str | None = Field(
        None, description="(extension) A reasoning model's thinking, when it wrote any."
    )
    tool_calls: list[ToolCallOut] | None = Field(None, description="Present when it called.")


class FunctionCallDelta(ResponseModel):
    name: str | None = Field(None, description="In the call's first delta.")
    arguments: str = Field(description="The next piece of the arguments' JSON text.")


class ToolCallDeltaOut(ResponseModel):
    index: int
    id: str | None = Field(None, description="In the call's first delta.")
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatChoice(ResponseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: StopReason


class ChatCompletionResponse(_Envelope):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(ResponseModel):
    role: Literal["assistant"] | None = Field(None, description="In each choice's first chunk.")
    content: str | None = None
    reasoning_content: str | None = Field(None, description="(extension) Thinking text.")
    tool_calls: list[ToolCallDeltaOut] | None = None


class ChatChunkChoice(ResponseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: StopReason = Field(None, description="Only in a choice's last chunk.")


class ChatCompletionChunk(_Envelope):
    """One event of a streamed /v1/chat/completions."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Usage | None = Field(
        None, description="With include_usage: null, then the totals in a last chunk."
    )


class CompletionChunkChoice(ResponseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: StopReason = Field(None, description="Only in a choice's last chunk.")


class CompletionChunk(_Envelope):
    """One event of a streamed /v1/completions."""

    object: Literal["text_completion"]
    choices: list[CompletionChunkChoice]
    usage: Usage | None = Field(
        None, description="With include_usage: null, then the totals in a last chunk."
    )


class ModelCard(ResponseModel):
    id: str = Field(description="The name requests use (--served-model-name).")
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str = Field(description="The model the engine loaded.")
    max_model_len: int | None = Field(
        default=None, description="Its longest sequence (null while it is not loaded)."
    )
    status: Literal["loaded", "loading", "unloaded"] | None = Field(
        default=None, description="With several models: whether it is loaded now."
    )
    kind: Literal["generate", "embed", "rerank"] | None = Field(
        default=None, description="With several models: what it serves."
    )
    memory_bytes: int | None = Field(
        default=None,
        description="With several models: the bytes its plan holds (its weight files' size "
        "before its first load).",
    )
    pinned: bool | None = Field(default=None, description="Never unloaded (several models).")
    error: str | None = Field(default=None, description="Why its last load failed.")
    reasoning: bool | None = Field(
        default=None,
        description="(extension) Its chat template writes <think> reasoning, so "
        "chat_template_kwargs.enable_thinking means something (null while it is not loaded).",
    )
    input_modalities: list[Literal["text", "image"]] | None = Field(
        default=None,
        description='(extension) What its prompts may hold: ["text"], or ["text", "image"] for '
        "a model that takes image_url content parts (null while it is not loaded).",
    )


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(ResponseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(ResponseModel):
    prompt: str


class ProbeResponse(ResponseModel):
    """GET /health/live and /health/ready."""

    status: Literal["ok", "unavailable"]
    reason: str | None = Field(
        None,
        description='Why not ok: "loading", "warming up", "draining", "engine core gone" or '
        '"engine failed to load".',
    )


class HealthResponse(ResponseModel):
    status: Literal["ok", "loading", "draining", "error"]
    phase: str | None = Field(
        None,
        description="What the engine is doing while it loads (status loading): e.g. "
        '"converting the GGUF file ...", "loading weights", "warming up".',
    )
    error: str | None = Field(
        None, description="Why the engine failed to load or stopped (status error)."
    )
