"""A /v1/responses body into the one internal generation request (protocol.GenerateRequest):
input items become chat messages, flat function tools become chat tools, text.format becomes
response_format, and the result is checked by the chat route's own parser, so both APIs accept
and refuse the same things. Errors name the Responses field (`input[2].call_id`,
`tools[0].parameters`, `text.format.schema`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from appliance.server.errors import APIError, bad_request
from appliance.server.protocol import GenerateRequest, parse_chat
from appliance.server.responses_api.schema import (
    ITEMS,
    MAX_METADATA,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    ImagePart,
    MessageItem,
    NamedFunction,
    ReasoningItem,
    ResponsesRequest,
)
from appliance.server.validation import explain, validate

HOSTED_CHOICES = "a hosted tool (this server runs function tools only)"
_CHAT_PARAMS = [
    (re.compile(r"^response_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"^response_format.*"), "text.format"),
    (re.compile(r"^tools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"^messages.*"), "input"),
    (re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
]
"""The chat parser's parameter names -> the Responses field they came from."""


@dataclass
class Parsed:
    """A validated /v1/responses body: the body, the generation request, and the conversation
    items it ran on (a stored previous response's, then this input's)."""

    body: ResponsesRequest
    generate: GenerateRequest
    items: list[dict]


def parse_responses(data: dict, history: Callable[[str], list[dict]]) -> Parsed:
    """Validate a body; `history` gives the stored conversation of a previous_response_id
    (or raises the error that answers it)."""
    body = validate(ResponsesRequest, data)
    if body.metadata is not None and len(body.metadata) > MAX_METADATA:
        raise bad_request(f"'metadata' may hold at most {MAX_METADATA} pairs", param="metadata")
    own = body.input
    if isinstance(own, str):
        own = [{"type": "message", "role": "user", "content": own}]
    before = history(body.previous_response_id) if body.previous_response_id else []
    items = [*before, *own]
    offset = len(before)
    messages = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages += chat_messages(items, offset)
    chat: dict = {"messages": messages, "stream": body.stream}
    for name in ("model", "temperature", "top_p", "stop", "seed", "parallel_tool_calls"):
        if getattr(body, name) is not None:
            chat[name] = getattr(body, name)
    if body.max_output_tokens is not None:
        chat["max_completion_tokens"] = body.max_output_tokens
    if body.tools:
        chat["tools"] = [_tool(i, t) for i, t in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(body.tool_choice)
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type != "text":
        chat["response_format"] = _response_format(fmt)
    reasoning = [m.pop("reasoning_content", None) for m in messages]
    try:
        req = parse_chat(chat)
    except APIError as err:
        raise renamed(err) from None
    for source, where in zip(req.images, _image_fields(items, offset), strict=True):
        source.where = where  # named as this API names it
    for message, text in zip(req.messages, reasoning):
        if text:
            message["reasoning_content"] = text  # Qwen3-style templates read it
    req.endpoint = "responses"
    return Parsed(body, req, items)


def renamed(err: APIError) -> APIError:
    """A chat parser's error with its parameter named as the Responses API names it."""
    if err.param is None:
        return err
    for pattern, name in _CHAT_PARAMS:
        if pattern.match(err.param):
            new = pattern.sub(name, err.param)
            err.message = err.message.replace(err.param, new)
            err.param = new
            break
    return err


def _item(model: type[BaseModel], data: dict, where: str):
    """`data` as `model`; a 400 naming the field under `where` (input[3].call_id)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = explain(model, exc.errors(include_url=False))
    inner = err.param
    full = f"{where}.{inner}" if inner else where
    if inner and err.message.startswith(f"'{inner}'"):
        err.message = full + err.message[len(inner) + 2 :]
    elif inner and err.message.startswith(inner):
        err.message = full + err.message[len(inner) :]
    elif not inner:
        err.message = f"{where}: {err.message}"
    err.param = full
    raise err


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.refusal if p.type == "refusal" else p.text for p in content)


def chat_messages(items: list, offset: int = 0) -> list[dict]:
    """Input items -> chat messages: consecutive function calls join one assistant message
    (with the text of an assistant message just before them), each output is a tool message,
    and a reasoning item's text rides on the next assistant turn as reasoning_content."""
    out: list[dict] = []
    reasoning: list[str] = []
    for i, raw in enumerate(items):
        where = f"input[{i - offset}]" if i >= offset else "previous_response_id"
        if not isinstance(raw, dict):
            raise bad_request(f"{where} must be an object (an input item)", param=where)
        kind = raw.get("type", "message")
        model = ITEMS.get(kind)
        if model is None:
            shown = json.dumps(kind)
            raise bad_request(
                f"{where}.type {shown} is not supported: this server takes message, "
                "function_call, function_call_output and reasoning items",
                param=f"{where}.type",
            )
        item = _item(model, raw, where)
        if isinstance(item, ReasoningItem):
            parts = item.content if item.content else item.summary
            reasoning.append("\n".join(p.text for p in parts))
            continue
        if isinstance(item, MessageItem):
            message = {"role": item.role, "content": _message_content(item, where)}
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function"}
            call["function"] = {"name": item.name, "arguments": item.arguments}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            assert isinstance(item, FunctionCallOutputItem)
            content = _text(item.output)
            message = {"role": "tool", "tool_call_id": item.call_id, "content": content}
        if message["role"] == "assistant" and reasoning:
            message["reasoning_content"] = "\n".join(reasoning)
            reasoning = []
        out.append(message)
    return out


def _message_content(item: MessageItem, where: str) -> str | list[dict]:
    """A message's content as the chat route takes it: its text, or with images a list of
    chat parts ({"type": "text"} and {"type": "image_url"})."""
    content = item.content
    if isinstance(content, str) or not any(isinstance(p, ImagePart) for p in content):
        return _text(content)
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, ImagePart):
            parts.append({"type": "text", "text": _text([part])})
            continue
        field = f"{where}.content[{j}]"
        if item.role != "user":
            raise bad_request(f"{field}: images belong in user messages", param=field)
        if part.image_url is None:
            what = "file_id is not supported (this server keeps no files)" if part.file_id else ""
            raise bad_request(
                f"{field}: {what or 'image_url is required'}; send the image as image_url, a "
                "data URL (data:image/png;base64,...)",
                param=f"{field}.{'file_id' if part.file_id else 'image_url'}",
            )
        parts.append({"type": "image_url", "image_url": {"url": part.image_url}})
    return parts


def _image_fields(items: list, offset: int) -> list[str]:
    """The Responses field of each input_image part of the items, in order."""
    fields = []
    for i, raw in enumerate(items):
        content = raw.get("content") if isinstance(raw, dict) else None
        if raw.get("type", "message") != "message" or not isinstance(content, list):
            continue
        where = f"input[{i - offset}]" if i >= offset else "previous_response_id"
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "input_image":
                fields.append(f"{where}.content[{j}].image_url")
    return fields


def _tool(i: int, raw: dict) -> dict:
    where = f"tools[{i}]"
    kind = raw.get("type")
    if kind != "function":
        raise bad_request(
            f"{where}.type {json.dumps(kind)} is {HOSTED_CHOICES}: send "
            '{"type": "function", "name", "parameters"} tools and run the tool yourself',
            param=f"{where}.type",
        )
    tool = _item(FunctionTool, raw, where)
    function = tool.model_dump(exclude_none=True, exclude={"type"})
    return {"type": "function", "function": function}


def _tool_choice(choice) -> str | dict:
    if isinstance(choice, str):
        return choice
    if choice.get("type") != "function":
        shown = json.dumps(choice.get("type"))
        raise bad_request(
            f'tool_choice of type {shown} names {HOSTED_CHOICES}: use "none", "auto", '
            '"required" or {"type": "function", "name": ...}',
            param="tool_choice",
        )
    named = _item(NamedFunction, choice, "tool_choice")
    return {"type": "function", "function": {"name": named.name}}


def _response_format(fmt) -> dict:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise bad_request(
            'text.format of type "json_schema" needs "schema": {...}', param="text.format.schema"
        )
    spec = {"name": fmt.name, "schema": fmt.schema_}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}
