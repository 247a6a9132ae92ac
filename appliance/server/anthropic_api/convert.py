"""A Messages request as the one internal generation request (protocol.GenerateRequest) that
/v1/chat/completions also builds: the same chat messages for the template, tools, tool_choice,
sampling fields and constraint, so the rest of the path cannot tell the two apart."""

from __future__ import annotations

import json
import re

from appliance.generation_defaults import DEFAULTED
from appliance.server.anthropic_api.schema import (
    Base64Source,
    CountTokensRequest,
    ImageBlock,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from appliance.server.errors import bad_request
from appliance.server.protocol import SAMPLING_FIELDS, GenerateRequest, ImageSource
from appliance.server.schema.requests import SamplingRequest
from engine.structured import StructuredOutput

ERROR_PREFIX = "Error: "
"""What leads a tool_result's text when its is_error is true."""
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
BLOCK_SEPARATOR = "\n\n"
"""Between the text blocks of a system prompt, a user turn or a tool result."""


def generate_request(body: CountTokensRequest) -> GenerateRequest:
    """The generation request of a validated Messages (or count_tokens) body."""
    req = GenerateRequest(endpoint="messages", model=body.model)
    req.messages = chat_messages(body, req.images)
    thinking = body.thinking is not None and body.thinking.type != "disabled"
    req.template_kwargs = {"enable_thinking": thinking}
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is not None:
        req.structured = StructuredOutput.json_schema(fmt.schema_)
    _tools(body, req)
    if isinstance(body, MessagesRequest):
        req.stream = body.stream
        req.max_tokens = body.max_tokens
        req.max_tokens_fits_context = True
        req.sampling = _sampling(body)
    return req


def _sampling(body: MessagesRequest) -> dict:
    """SamplingParams fields: the body's, else what /v1/chat/completions leaves when omitted
    (an omitted DEFAULTED field stays absent: apply_defaults fills it)."""
    sampling = {name: SamplingRequest.model_fields[name].default for name in SAMPLING_FIELDS}
    sampling.update(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=list(body.stop_sequences or []),
        stop_token_ids=[],
    )
    return {k: v for k, v in sampling.items() if not (k in DEFAULTED and v is None)}


def _tools(body: CountTokensRequest, req: GenerateRequest) -> None:
    """Anthropic's tools and tool_choice as OpenAI's, which the template and parsers read."""
    choice = body.tool_choice
    names = [tool.name for tool in body.tools or []]
    for i, tool in enumerate(body.tools or []):
        if not TOOL_NAME.match(tool.name):
            raise bad_request(
                f"tools[{i}].name must be letters, digits, '_' or '-'", param=f"tools[{i}].name"
            )
        kind = tool.input_schema.get("type", "object")
        if kind != "object":
            raise bad_request(
                f'tools[{i}].input_schema must be a JSON Schema of "type": "object", not of '
                f"type {json.dumps(kind)}",
                param=f"tools[{i}].input_schema",
            )
    forced = isinstance(choice, ToolChoiceAny | ToolChoiceTool)
    if forced and not names:
        raise bad_request(f'tool_choice "{choice.type}" needs tools', param="tool_choice")
    if isinstance(choice, ToolChoiceTool):
        if choice.name not in names:
            raise bad_request(
                f"tool_choice names the tool {choice.name!r}, which is not in tools "
                f"({', '.join(names)})",
                param="tool_choice",
            )
        req.tool_choice, req.tool_name = "function", choice.name
    elif isinstance(choice, ToolChoiceAny):
        req.tool_choice = "required"
    elif isinstance(choice, ToolChoiceNone):
        req.tool_choice = "none"
    if forced and req.structured is not None:
        raise bad_request(
            f'tool_choice "{choice.type}" forces a tool call: drop output_config.format, or '
            'use tool_choice "auto"',
            param="tool_choice",
        )
    req.parallel_tool_calls = not getattr(choice, "disable_parallel_tool_use", False)
    if names and req.tool_choice != "none":
        req.tools = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description or "",
                    "parameters": tool.input_schema,
                },
            }
            for tool in body.tools
        ]


def chat_messages(body: CountTokensRequest, images: list[ImageSource]) -> list[dict]:
    """The conversation as chat templates take it (the OpenAI shape): the system prompt, a
    user's text, each tool_result as a "tool" message, an assistant's text with its tool_use
    blocks as tool_calls and its thinking as reasoning_content (which reasoning templates read).
    A redacted_thinking block is left out. The conversation must end with a user turn. A user
    turn with images is a content list of text and {"type": "image"} parts; each image's source
    is appended to `images`."""
    out: list[dict] = []
    if body.system:
        out.append({"role": "system", "content": _text(body.system)})
    names: dict[str, str] = {}  # tool_use id -> tool name
    for i, msg in enumerate(body.messages):
        blocks = msg.content
        if isinstance(blocks, str):
            blocks = [TextBlock(type="text", text=blocks)]
        if msg.role == "assistant":
            for j, block in enumerate(blocks):
                if isinstance(block, ImageBlock):
                    where = f"messages[{i}].content[{j}]"
                    raise bad_request(f"{where}: images belong in user messages", param=where)
            out.append(_assistant(blocks, names))
            continue
        texts: list[str | dict] = []
        for j, block in enumerate(blocks):
            if isinstance(block, ToolResultBlock):
                if texts:
                    out.append({"role": "user", "content": _user_content(texts)})
                    texts = []
                out.append(_tool_message(block, names, f"messages[{i}].content[{j}]"))
            elif isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ImageBlock):
                images.append(_image_source(block, f"messages[{i}].content[{j}].source"))
                texts.append({"type": "image"})
            elif isinstance(block, ToolUseBlock | ThinkingBlock):
                raise bad_request(
                    f"messages[{i}].content[{j}]: a {block.type} block belongs in an assistant "
                    "message",
                    param=f"messages[{i}].content[{j}]",
                )
        if texts or not any(isinstance(b, ToolResultBlock) for b in blocks):
            out.append({"role": "user", "content": _user_content(texts)})
    if body.messages[-1].role == "assistant":
        raise bad_request(
            "the last message is the assistant's: continuing a partial answer (prefill) is not "
            "supported; end with a user message",
            param=f"messages[{len(body.messages) - 1}]",
        )
    return out


def _user_content(parts: list[str | dict]) -> str | list[dict]:
    """A user turn's text blocks joined; with images, the parts as multimodal templates take
    them (each text block its own part)."""
    if all(isinstance(p, str) for p in parts):
        return BLOCK_SEPARATOR.join(parts)
    return [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]


def _image_source(block: ImageBlock, where: str) -> ImageSource:
    source = block.source
    if isinstance(source, Base64Source):
        return ImageSource(where, f"data:{source.media_type};base64,{source.data}")
    return ImageSource(where, source.url)


def _assistant(blocks: list, names: dict[str, str]) -> dict:
    texts, thinking, calls = [], [], []
    for block in blocks:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            names[block.id] = block.name
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
    entry: dict = {"role": "assistant", "content": "".join(texts)}
    if calls:
        entry["tool_calls"] = calls
    if thinking:
        entry["reasoning_content"] = "".join(thinking)
    return entry


def _tool_message(block: ToolResultBlock, names: dict[str, str], where: str) -> dict:
    if block.tool_use_id not in names:
        raise bad_request(
            f"{where}.tool_use_id {block.tool_use_id!r} answers no tool_use block of an earlier "
            "assistant message",
            param=f"{where}.tool_use_id",
        )
    text = _text(block.content)
    if block.is_error:
        text = ERROR_PREFIX + text
    return {
        "role": "tool",
        "tool_call_id": block.tool_use_id,
        "name": names[block.tool_use_id],
        "content": text,
    }


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else BLOCK_SEPARATOR.join(b.text for b in content)
