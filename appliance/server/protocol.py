"""Decoded request bodies (server.body) into what the routes run (no I/O, no engine):
validation through the schema models (appliance.server.schema), and the checks that span fields.

Every rejection is an APIError(400) whose message names the parameter and what it allows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields

from appliance.generation_defaults import DEFAULTED, GenerationDefaults, server_defaults
from appliance.server.errors import bad_request
from appliance.server.schema.requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    ImagePart,
    SamplingRequest,
    TokenizeRequest,
)
from appliance.server.validation import validate
from engine.sampling_params import PRIORITIES, SamplingParams
from engine.structured import StructuredOutput

SAMPLING_FIELDS = tuple(
    f.name
    for f in fields(SamplingParams)
    if f.name in SamplingRequest.model_fields and f.name != "seed"
)
"""Request fields handed to SamplingParams as they are (seed is offset per choice)."""
TRACED = ("min_p", "presence_penalty", "frequency_penalty", "seed")
"""Sampling fields shown in traces besides DEFAULTED (seed: choice 0's)."""
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class ImageSource:
    """One image of a request, as sent (appliance.server.image_inputs reads it)."""

    where: str
    """The request field it came from (messages[0].content[1].image_url), for error messages."""
    url: str
    """A data: URL or an http(s) URL (an Anthropic base64 source is made a data: URL)."""


@dataclass
class GenerateRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    endpoint: str
    """'completions' or 'chat'."""
    model: str | None
    prompts: list[str | list[int]] = field(default_factory=list)
    """Completions: each prompt gets n choices."""
    messages: list[dict] | None = None
    """Chat: normalised to {'role', 'content': str} (+ tool_calls, tool_call_id); a message
    with images has a content list of {"type": "text", "text"} and {"type": "image"} parts."""
    images: list[ImageSource] = field(default_factory=list)
    """Chat: the images of the messages' {"type": "image"} parts, in order."""
    image_inputs: list | None = None
    """The images as the engine takes them (engine.multimodal.ImageInput), once the prompt
    is rendered."""
    tools: list[dict] | None = None
    """Chat: OpenAI tool definitions, for the template; None when the output is all content."""
    parallel_tool_calls: bool = True
    tool_choice: str = "auto"
    """"none", "auto", "required", or "function" (a call of `tool_name`)."""
    tool_name: str | None = None
    template_kwargs: dict | None = None
    structured: StructuredOutput | None = None
    """What the output must follow (response_format, regex, choice, grammar); a forced tool
    call's grammar is added where the model's call format is known (the routes)."""
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    """None = the endpoint's default (16 for completions, the rest of the context for chat)."""
    max_tokens_fits_context: bool = False
    """The request's max_tokens is a ceiling cut to the rest of the context (Anthropic clients
    ask for 32000 whatever the model's context holds), not a 400 when it does not fit."""
    logprobs: int | None = None
    """Top-n alternatives to return; None = no logprobs."""
    seed: int | None = None
    sampling: dict = field(default_factory=dict)
    """SamplingParams fields; a defaulted field (DEFAULTED) is absent until apply_defaults."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each DEFAULTED field's value came from (SOURCES): set by apply_defaults."""

    def params(
        self,
        choice: int,
        max_tokens: int,
        priority: str = PRIORITIES[0],
        client: str | None = None,
        share_weight: float = 1.0,
    ) -> SamplingParams:
        """SamplingParams for one choice; choice i of a seeded request uses seed + i.
        `priority`, `client` (the API key's name) and `share_weight` come from the key it was
        sent with."""
        seed = None if self.seed is None else (self.seed + choice) % (1 << 63)
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                seed=seed,
                logprobs=self.logprobs,
                structured=self.structured,
                priority=priority,
                client=client,
                share_weight=share_weight,
                **self.sampling,
            )
        except ValueError as exc:
            raise bad_request(str(exc)) from None


def _common(body: SamplingRequest, endpoint: str) -> GenerateRequest:
    sampling = {name: getattr(body, name) for name in SAMPLING_FIELDS}
    for name in DEFAULTED:  # None = omitted: apply_defaults fills it
        if sampling.get(name, 0) is None:
            del sampling[name]
    stop = sampling["stop"]
    sampling["stop"] = [] if stop is None else [stop] if isinstance(stop, str) else stop
    sampling["stop_token_ids"] = sampling["stop_token_ids"] or []
    options = body.stream_options
    return GenerateRequest(
        endpoint=endpoint,
        model=body.model,
        n=body.n,
        stream=body.stream,
        include_usage=body.stream and options is not None and options.include_usage,
        seed=body.seed,
        sampling=sampling,
        structured=structured_output(body),
    )


def apply_defaults(req: GenerateRequest, defaults: GenerationDefaults) -> None:
    """Fill the DEFAULTED fields the body omitted: the overrides', else the model's, else the
    server's (SamplingParams'; max_tokens: 16 for completions, the rest of the context for chat,
    left None here); record in req.sources where each value came from."""
    ours = server_defaults()
    for name in DEFAULTED:
        given = req.max_tokens if name == "max_tokens" else req.sampling.get(name)
        if given is not None:
            req.sources[name] = "request"
            continue
        value, source = defaults.values.get(name), defaults.sources.get(name, "server")
        if name == "max_tokens":
            if value is None and req.endpoint == "completions":
                value = ours[name]
            req.max_tokens = value
        else:
            req.sampling[name] = ours[name] if value is None else value
        req.sources[name] = source


def effective_params(
    params: SamplingParams, sources: dict[str, str], max_tokens: list[int]
) -> dict:
    """The sampling values a request ran with, for its trace and log line: the DEFAULTED fields
    with where each came from, and the other sampling fields a request may set."""
    out = {name: getattr(params, name) for name in (*DEFAULTED, *TRACED) if name != "max_tokens"}
    out["max_tokens"] = max_tokens[0] if len(set(max_tokens)) == 1 else max_tokens
    out["sources"] = dict(sources)
    return out


def structured_output(body: SamplingRequest) -> StructuredOutput | None:
    """The one constraint a body asks for (response_format or an extra), or None."""
    asked = [
        name
        for name in ("response_format", "regex", "choice", "grammar")
        if getattr(body, name) is not None
        and not (name == "response_format" and body.response_format.type == "text")
    ]
    if len(asked) > 1:
        raise bad_request(
            f"send at most one of {', '.join(asked)}: each constrains the whole output",
            param=asked[1],
        )
    if not asked:
        return None
    if body.regex is not None:
        return StructuredOutput("regex", body.regex)
    if body.choice is not None:
        return StructuredOutput.choice(body.choice)
    if body.grammar is not None:
        return StructuredOutput("grammar", body.grammar)
    fmt = body.response_format
    if fmt.type == "json_object":
        return StructuredOutput("json_object")
    if fmt.json_schema is None:
        raise bad_request(
            'response_format of type "json_schema" needs "json_schema": {"name": ..., '
            '"schema": {...}}',
            param="response_format.json_schema",
        )
    return StructuredOutput.json_schema(fmt.json_schema.schema_)


def parse_completion(data: dict) -> GenerateRequest:
    """Validate a /v1/completions body."""
    body = validate(CompletionRequest, data)
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request("'best_of' different from 'n' is not supported", param="best_of")
    req = _common(body, "completions")
    req.max_tokens = body.max_tokens
    req.logprobs = body.logprobs
    prompt = body.prompt
    one = isinstance(prompt, str) or all(isinstance(t, int) for t in prompt)
    req.prompts = [prompt] if one else list(prompt)
    return req


def parse_chat(data: dict) -> GenerateRequest:
    """Validate a /v1/chat/completions body."""
    body = validate(ChatCompletionRequest, data)
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    req = _common(body, "chat")
    req.max_tokens = body.max_completion_tokens or body.max_tokens  # both >= 1 when set
    req.logprobs = (body.top_logprobs or 0) if body.logprobs else None
    req.messages = chat_messages(body.messages, req.images)
    for i, tool in enumerate(body.tools or []):
        if not TOOL_NAME.match(tool.function.name):
            raise bad_request(
                f"tools[{i}].function.name must be letters, digits, '_', '.' or '-'",
                param=f"tools[{i}].function.name",
            )
        kind = (tool.function.parameters or {}).get("type", "object")
        if kind != "object":
            raise bad_request(
                f"tools[{i}].function.parameters must be a JSON Schema of an object (the "
                f"arguments are named), not of type {json.dumps(kind)}",
                param=f"tools[{i}].function.parameters",
            )
    _tool_choice(body, req)
    req.parallel_tool_calls = body.parallel_tool_calls is not False
    req.template_kwargs = body.chat_template_kwargs
    return req


def _tool_choice(body: ChatCompletionRequest, req: GenerateRequest) -> None:
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if isinstance(choice, str):
        req.tool_choice = choice
    else:
        req.tool_choice, req.tool_name = "function", choice.function.name
    forced = req.tool_choice in ("required", "function")
    if forced and not body.tools:
        raise bad_request(f"tool_choice {_shown(choice)} needs 'tools'", param="tool_choice")
    if req.tool_name is not None and all(t.function.name != req.tool_name for t in body.tools):
        names = ", ".join(t.function.name for t in body.tools)
        raise bad_request(
            f"tool_choice names the function {req.tool_name!r}, which is not in tools ({names})",
            param="tool_choice",
        )
    if forced and req.structured is not None:
        raise bad_request(
            f"tool_choice {_shown(choice)} forces a tool call: drop response_format, regex, "
            'choice and grammar, or use tool_choice "auto"',
            param="tool_choice",
        )
    if body.tools and req.tool_choice != "none":
        req.tools = [t.model_dump(exclude_none=True) for t in body.tools]


def _shown(choice) -> str:
    return json.dumps(choice) if isinstance(choice, str) else "naming a function"


def chat_messages(
    messages: list[ChatMessage], images: list[ImageSource] | None = None
) -> list[dict]:
    """Messages as chat templates take them: [{'role', 'content': str}], with an assistant's
    tool_calls and a tool message's tool_call_id where they were sent. A user message with
    image parts keeps a content list, each image a {"type": "image"} part whose source is
    appended to `images` (None: images are refused)."""
    out = []
    for i, msg in enumerate(messages):
        content = msg.content
        if content is None:
            if not msg.tool_calls:
                raise bad_request(
                    f"messages[{i}].content may be null only in an assistant message with "
                    "tool_calls",
                    param=f"messages[{i}].content",
                )
            content = ""
        elif any(isinstance(part, ImagePart) for part in content):
            content = _image_content(i, msg, images)
        elif not isinstance(content, str):
            content = "".join(part.text for part in content)
        # Chat templates know "system"; OpenAI's newer "developer" role means the same.
        role = "system" if msg.role == "developer" else msg.role
        entry: dict = {"role": role, "content": content}
        if msg.tool_calls:
            entry["tool_calls"] = [call.model_dump() for call in msg.tool_calls]
        if msg.tool_call_id is not None:
            entry["tool_call_id"] = msg.tool_call_id
        out.append(entry)
    return out


def _image_content(i: int, msg: ChatMessage, images: list[ImageSource] | None) -> list[dict]:
    """A user message's parts as multimodal templates take them, its images' sources added to
    `images`."""
    first = next(j for j, p in enumerate(msg.content) if isinstance(p, ImagePart))
    where = f"messages[{i}].content[{first}].image_url"
    if images is None:
        raise bad_request(f"{where}: images are not taken here; send text alone", param=where)
    if msg.role != "user":
        raise bad_request(f"{where}: images belong in user messages", param=where)
    parts = []
    for j, part in enumerate(msg.content):
        if isinstance(part, ImagePart):
            images.append(ImageSource(f"messages[{i}].content[{j}].image_url", part.image_url.url))
            parts.append({"type": "image"})
        else:
            parts.append({"type": "text", "text": part.text})
    return parts


def parse_tokenize(data: dict) -> tuple[str | None, list[dict] | None, bool]:
    """(prompt, messages, add_special_tokens) of a /tokenize body; exactly one of the first two."""
    body = validate(TokenizeRequest, data)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("send exactly one of 'prompt' (a string) or 'messages'")
    messages = None if body.messages is None else chat_messages(body.messages)
    return body.prompt, messages, body.add_special_tokens


def parse_detokenize(data: dict, vocab_size: int) -> list[int]:
    """The token ids of a /detokenize body, each checked against the vocabulary."""
    tokens = validate(DetokenizeRequest, data).tokens
    if any(t >= vocab_size for t in tokens):
        raise bad_request(f"'tokens' must be a list of token ids in [0, {vocab_size})", "tokens")
    return tokens
