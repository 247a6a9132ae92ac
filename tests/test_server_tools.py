"""Chat requests with tools and reasoning on a fake engine that writes a scripted answer:
tool calls parsed into message.tool_calls (whole and streamed), finish_reason "tool_calls",
reasoning split into reasoning_content, template variables, and a tool conversation sent back."""

from __future__ import annotations

import json

import pytest

from appliance.settings import ServeSettings, SettingsError
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client, sse_events

CHAT = "/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
MSGS = [{"role": "user", "content": "w20 weather?"}]


def assemble(events: list) -> tuple[str, dict, list]:
    """content, reasoning and tool calls as a client puts a stream's deltas together."""
    content, reasoning, calls = "", "", {}
    for e in events:
        for choice in e["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                entry["id"] = call.get("id") or entry["id"]
                entry["name"] += call.get("function", {}).get("name") or ""
                entry["arguments"] += call.get("function", {}).get("arguments") or ""
    return content, reasoning, [calls[i] for i in sorted(calls)]


async def test_a_call_is_parsed_whole_and_streamed_alike():
    engine = FakeEngine(script="Let me look.\n" + CALL)
    async with fake_client(engine, tool_parser="hermes") as client:
        body = {"messages": MSGS, "tools": TOOLS, "max_tokens": 100}
        whole = await (await client.post(CHAT, json=body)).json()
        choice = whole["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        assert "<tool_call>" not in (choice["message"]["content"] or "")
        r = await client.post(CHAT, json={**body, "stream": True})
        events = sse_events(await r.text())
        content, _, calls = assemble(events)
        assert content == choice["message"]["content"] and "<tool" not in content
        assert [(c["name"], c["arguments"]) for c in calls] == [
            ("get_weather", call["function"]["arguments"])
        ]
        reasons = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        assert reasons == ["tool_calls"]


async def test_tool_choice_none_and_no_tools_leave_the_text_as_content():
    engine = FakeEngine(script=CALL)
    async with fake_client(engine, tool_parser="hermes") as client:
        for extra in ({"tools": TOOLS, "tool_choice": "none"}, {}):
            r = await client.post(CHAT, json={"messages": MSGS, "max_tokens": 100, **extra})
            choice = (await r.json())["choices"][0]
            assert choice["message"]["content"] == CALL and choice["finish_reason"] == "stop"
            assert "tool_calls" not in choice["message"]


async def test_reasoning_goes_to_reasoning_content():
    script = "<think>\nThe user greets.\n</think>\n\nHello!"
    engine = FakeEngine(script=script, chat_template="{{ messages }} <think>")
    async with fake_client(engine) as client:
        body = {"messages": MSGS, "max_tokens": 100}
        message = (await (await client.post(CHAT, json=body)).json())["choices"][0]["message"]
        assert message["content"] == "Hello!" and "think>" not in message["content"]
        assert "The user greets." in message["reasoning_content"]
        r = await client.post(CHAT, json={**body, "stream": True})
        content, reasoning, _ = assemble(sse_events(await r.text()))
        assert (content, reasoning) == (message["content"], message["reasoning_content"])


async def test_template_variables_and_a_tool_conversation_reach_the_template():
    async with fake_client(FakeEngine()) as client:
        body = {"messages": MSGS, "max_tokens": 2}
        plain = (await (await client.post(CHAT, json=body)).json())["usage"]["prompt_tokens"]
        kwargs = {**body, "chat_template_kwargs": {"enable_thinking": False}}
        r = await client.post(CHAT, json=kwargs)
        assert (await r.json())["usage"]["prompt_tokens"] == plain + 2  # "enable_thinking: False"
        call = {"id": "call_1", "type": "function"}
        call["function"] = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        turns = MSGS + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        r = await client.post(CHAT, json={"messages": turns, "tools": TOOLS, "max_tokens": 2})
        assert r.status == 200, await r.text()
        bad = [{"role": "user", "content": None}]
        r = await client.post(CHAT, json={"messages": bad, "max_tokens": 2})
        assert r.status == 400 and "tool_calls" in (await r.json())["error"]["message"]


async def test_forced_tool_choice_without_a_fast_tokenizer_is_refused_clearly():
    """A forced call is a grammar, and grammars need the model's tokenizer.json: the fake
    engine's tokenizer has none (forced calls on a real tokenizer: test_structured_openai)."""
    async with fake_client() as client:
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            body = {"messages": MSGS, "tools": TOOLS, "tool_choice": choice}
            r = await client.post(CHAT, json=body)
            err = (await r.json())["error"]
            assert r.status == 400 and err["param"] == "tool_choice", err


def test_an_unknown_tool_parser_is_refused_at_start():
    with pytest.raises(SettingsError, match="tool_parser must be one of hermes"):
        ServeSettings(tool_parser="hermès")
