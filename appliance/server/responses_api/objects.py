"""The Responses API's response object: what a request asked for (echoed), its status, output
items, usage and the `output_text` convenience field."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from appliance.server.responses_api.schema import ResponsesRequest


@dataclass
class ResponseHead:
    """The parts of a response object fixed when the request is accepted."""

    id: str
    model: str
    body: ResponsesRequest
    created_at: int = field(default_factory=lambda: int(time.time()))

    def echo(self) -> dict:
        """The request's settings as the response object repeats them."""
        b = self.body
        fmt = b.text.format if b.text is not None and b.text.format is not None else None
        text_format = {"type": "text"}
        if fmt is not None and fmt.type == "json_object":
            text_format = {"type": "json_object"}
        elif fmt is not None and fmt.type == "json_schema":
            text_format = {"type": "json_schema", "name": fmt.name, "schema": fmt.schema_}
            text_format.update(strict=bool(fmt.strict), description=fmt.description)
        reasoning = b.reasoning.model_dump() if b.reasoning is not None else None
        return {
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "metadata": b.metadata or {},
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id,
            "reasoning": reasoning or {"effort": None, "summary": None},
            "store": b.store,
            "temperature": b.temperature,
            "text": {"format": text_format},
            "tool_choice": b.tool_choice if b.tool_choice is not None else "auto",
            "tools": b.tools or [],
            "top_p": b.top_p,
            "truncation": "disabled",
            "user": b.user,
        }


def usage(input_tokens: int, output_tokens: int, cached: int, reasoning: int) -> dict:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def output_text(items: list[dict]) -> str:
    """Every output_text part of every message, joined (as OpenAI's SDKs compute it)."""
    return "".join(
        part["text"]
        for item in items
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def response_object(
    head: ResponseHead,
    status: str,
    output: list[dict],
    usage_: dict | None = None,
    error: dict | None = None,
) -> dict:
    """The response object; `status` is in_progress, completed, incomplete or failed (an
    incomplete response ran out of max_output_tokens or the context)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": head.id,
        "object": "response",
        "created_at": head.created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "model": head.model,
        "output": output,
        "output_text": output_text(output),
        **head.echo(),
        "usage": usage_,
    }
