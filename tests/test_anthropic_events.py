"""The Messages events of appliance.server.anthropic_api.events, built from the chat deltas of a
scripted output cut every way: the events come in Anthropic's order and assemble (as a client
puts them together) to the whole message, whose text, thinking and calls are what the chat
completion of the same output holds."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.server.anthropic_api.events import (
    MessageEvents,
    signature,
    stop_reason,
    usage,
)
from appliance.server.chat_output import ChatOutput

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PIECES = [
    "<think>",
    "</think>",
    "\n",
    "Hello",
    " world",
    "<",
    "<tool",
    CALL,
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, "é"]}}\n</tool_call>',
    "<tool_call>\nnot json\n</tool_call>",
    " ",
    "{}",
]


def assemble(events: list[tuple[str, dict]]) -> dict:
    """The message a client builds from the events, checking their order on the way."""
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == [
        "message_delta",
        "message_stop",
    ]
    message = json.loads(json.dumps(events[0][1]["message"]))
    assert message["content"] == [] and message["stop_reason"] is None
    open_index, partial = None, ""
    for kind, data in events[2:-2]:
        assert data["type"] == kind
        if kind == "content_block_start":
            assert open_index is None and data["index"] == len(message["content"])
            open_index = data["index"]
            message["content"].append(dict(data["content_block"]))
        elif kind == "content_block_delta":
            assert data["index"] == open_index
            block, delta = message["content"][open_index], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta" and block["type"] == "tool_use"
                partial += delta["partial_json"]
        else:
            assert kind == "content_block_stop" and data["index"] == open_index
            if message["content"][open_index]["type"] == "tool_use":
                message["content"][open_index]["input"] = json.loads(partial or "{}")
            open_index, partial = None, ""
    assert open_index is None
    delta = events[-2][1]
    message.update(delta["delta"], usage=delta["usage"])
    return message


def run(output: ChatOutput, deltas: list[str], finish=("stop", None)) -> tuple[list, MessageEvents]:
    stream, builder = output.stream(), MessageEvents("msg_1", "claude-x")
    events = builder.start(usage(10, 0, 0))
    for text in deltas:
        events += builder.feed(stream.feed(text))
    events += builder.feed(stream.finish())
    stop = stop_reason(finish[0], finish[1], builder.has_calls)
    return events + builder.finish(stop, usage(10, 7, 4)), builder


def same_ids(content: list[dict]) -> list[dict]:
    """Blocks with each tool_use id replaced by its rank (ids are random per parse)."""
    calls = iter(range(len(content)))
    return [{**b, "id": next(calls)} if b["type"] == "tool_use" else b for b in content]


outputs = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)


@settings(max_examples=150, deadline=None)
@given(
    text=outputs,
    cuts=st.lists(st.integers(0, 400), max_size=6),
    reasoning=st.booleans(),
    starts=st.booleans(),
    parser=st.sampled_from([None, "hermes"]),
)
def test_every_split_assembles_to_the_whole_message(text, cuts, reasoning, starts, parser):
    output = ChatOutput(reasoning, starts and reasoning, parser)
    bounds = sorted({min(c, len(text)) for c in cuts})
    deltas = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    events, builder = run(output, deltas)
    whole_events, whole = run(output, [text])
    streamed = assemble(events)
    assert same_ids(streamed["content"]) == same_ids(whole.message()["content"])
    assert same_ids(builder.message()["content"]) == same_ids(streamed["content"])
    assert streamed == {**whole.message(), "content": streamed["content"]}
    # the blocks hold what the chat completion of the same output holds
    message, has_calls = output.message(text)
    blocks = whole.message()["content"]
    assert "".join(b["text"] for b in blocks if b["type"] == "text") == (message["content"] or "")
    thinking = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
    assert thinking == (message.get("reasoning_content") or "")
    calls = [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    expected = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls", [])
    ]
    assert calls == expected and has_calls == bool(calls)
    assert streamed["stop_reason"] == ("tool_use" if calls else "end_turn")
    for block in blocks:
        assert block["type"] != "text" or block["text"]
        if block["type"] == "thinking":
            assert block["signature"] == signature(block["thinking"])
        if block["type"] == "tool_use":
            assert block["id"].startswith("toolu_")


def test_a_reasoning_answer_with_a_call_by_hand():
    text = "<think>\nweather, so call\n</think>\n\nLet me look.\n" + CALL
    events, builder = run(ChatOutput(True, False, "hermes"), [text[:9], text[9:30], text[30:]])
    kinds = [k for k, _ in events]
    assert kinds.count("content_block_start") == 3 and kinds.count("content_block_stop") == 3
    message = assemble(events)
    thinking, answer, call = message["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "weather, so call"
    assert answer == {"type": "text", "text": "Let me look."}
    assert (call["name"], call["input"]) == ("get_weather", {"city": "Paris"})
    assert message["stop_reason"] == "tool_use" and message["stop_sequence"] is None
    assert message["usage"] == {
        "input_tokens": 6,
        "output_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
    }


def test_stop_reasons():
    assert stop_reason("length", None, True) == ("max_tokens", None)
    assert stop_reason("stop", "END", False) == ("stop_sequence", "END")
    assert stop_reason("stop", 2, False) == ("end_turn", None)
    assert stop_reason("stop", None, True) == ("tool_use", None)
