"""What a chat choice's generated text becomes in the response: reasoning (a model's
`<think>...</think>`, appliance.server.reasoning), content, and tool calls parsed from the
content by the model family's parser (appliance.server.tools). Whole, for a plain response, or
as deltas, for a stream: the deltas of a stream add up to the whole response."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.server.reasoning import ReasoningStream, split_reasoning
from appliance.server.tools import PARSERS, ContentDelta, ToolCallDelta


@dataclass(frozen=True)
class ChatOutput:
    """How one request's chat text is read: reasoning split or not, which tool parser (None:
    the text is all content), and whether several calls may be returned."""

    reasoning: bool = False
    starts_in_reasoning: bool = False
    tool_parser: str | None = None
    parallel_tool_calls: bool = True
    forced_calls: bool = False
    """tool_choice forced calls: markup cut short (by max_tokens) is dropped, not content."""

    @property
    def is_plain(self) -> bool:
        return not self.reasoning and self.tool_parser is None

    def message(self, text: str) -> tuple[dict, bool]:
        """The response's message for `text`, and whether it holds tool calls."""
        reasoning, content = None, text
        if self.reasoning:
            reasoning, content = split_reasoning(text, self.starts_in_reasoning)
        message: dict = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        calls = []
        if self.tool_parser is not None:
            parsed = PARSERS[self.tool_parser]().parse(content, self.forced_calls)
            calls = parsed.tool_calls if self.parallel_tool_calls else parsed.tool_calls[:1]
            message["content"] = parsed.content or None if calls else parsed.content
            if self.forced_calls:
                message["content"] = None  # calls only: what else there is, is a cut call
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
        return message, bool(calls)

    def stream(self) -> ChatStream:
        return ChatStream(self)


class ChatStream:
    """One choice's text deltas in, the chunk deltas out ({"reasoning_content": ...},
    {"content": ...}, {"tool_calls": [...]}); `has_calls` once a call has begun."""

    def __init__(self, output: ChatOutput) -> None:
        self.reasoning = ReasoningStream(output.starts_in_reasoning) if output.reasoning else None
        parser = output.tool_parser
        self.tools = PARSERS[parser]().stream(output.forced_calls) if parser is not None else None
        self.parallel = output.parallel_tool_calls
        self.forced = output.forced_calls
        self.has_calls = False

    def feed(self, text: str) -> list[dict]:
        """The deltas `text` makes certain, in the output's order."""
        if self.reasoning is None:
            return self._content(text)
        return self._route(self.reasoning.feed_parts(text))

    def finish(self) -> list[dict]:
        deltas = self._route(self.reasoning.finish_parts()) if self.reasoning else []
        if self.tools is not None:
            deltas += self._tool_deltas(self.tools.finish())
        return deltas

    def _route(self, parts: list[tuple[bool, str]]) -> list[dict]:
        deltas = []
        for is_reasoning, text in parts:
            deltas += [{"reasoning_content": text}] if is_reasoning else self._content(text)
        return deltas

    def _content(self, text: str) -> list[dict]:
        if self.tools is None:
            return [{"content": text}] if text else []
        return self._tool_deltas(self.tools.feed(text)) if text else []

    def _content_delta(self, text: str) -> list[dict]:
        if self.forced or not text:
            return []  # a forced output is calls only: other text is a call cut short
        return [{"content": text}]

    def _tool_deltas(self, items: list) -> list[dict]:
        deltas = []
        for item in items:
            if isinstance(item, ContentDelta):
                deltas += self._content_delta(item.text)
            elif isinstance(item, ToolCallDelta):
                if item.index > 0 and not self.parallel:
                    continue  # one call only: the rest is dropped, as in the whole response
                self.has_calls = True
                call: dict = {"index": item.index}
                if item.id is not None:
                    call.update(id=item.id, type="function")
                function = {}
                if item.name is not None:
                    function["name"] = item.name
                function["arguments"] = item.arguments_fragment
                call["function"] = function
                deltas.append({"tool_calls": [call]})
        return deltas
