"""POST /v1/responses on a fake engine that writes a scripted answer: text, the stream's events
(order, sequence numbers, text that assembles to the final response), reasoning items through
the official client, a tool call and its output sent back, max_output_tokens cut short,
previous_response_id, GET and DELETE, another key's 404, and bad bodies answered 400 in the
OpenAI envelope while the server serves on."""

from __future__ import annotations

import json

import pytest

from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client

openai = pytest.importorskip("openai")

RESPONSES = "/v1/responses"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINKING = "<think>\nThe user greets.\n</think>\n\nHello!"
ALICE, BOB = "sk-alice-0123456789", "sk-bob-0123456789"


def sse(text: str) -> list[dict]:
    """The events of a Responses stream: each `event:` line names its data's type."""
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        event = json.loads(lines["data"])
        assert lines["event"] == event["type"]
        events.append(event)
    return events


def streamed_text(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


async def test_text_whole_and_streamed():
    async with fake_client(FakeEngine(script="Hello there, friend.")) as client:
        r = await client.post(RESPONSES, json={"input": "w20 hi", "instructions": "Be brief."})
        body = await r.json()
        assert r.status == 200 and body["object"] == "response" and body["id"].startswith("resp_")
        assert body["status"] == "completed" and body["incomplete_details"] is None
        (message,) = body["output"]
        assert message["type"] == "message" and message["role"] == "assistant"
        assert message["content"][0]["text"] == body["output_text"] == "Hello there, friend."
        u = body["usage"]
        assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"] and u["output_tokens"]
        assert u["input_tokens_details"]["cached_tokens"] >= 0
        assert u["output_tokens_details"]["reasoning_tokens"] == 0

        r = await client.post(RESPONSES, json={"input": "w20 hi", "stream": True})
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = sse(await r.text())
        kinds = [e["type"] for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        final = events[-1]["response"]
        assert streamed_text(events) == final["output_text"] == "Hello there, friend."
        assert final["id"] == events[0]["response"]["id"]
        assert final["usage"]["output_tokens"] == u["output_tokens"]
        record = await (await client.get(f"/v1/requests/{r.headers['X-Request-Id']}")).json()
        assert record["endpoint"] == "responses"


async def test_reasoning_items_through_the_official_client():
    engine = FakeEngine(script=THINKING, chat_template="{{ messages }} <think>")
    async with fake_client(engine) as client:
        api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0)
        response = await api.responses.create(model="fake-model", input="w20 hi")
        reasoning, message = response.output
        assert reasoning.type == "reasoning"
        assert reasoning.content[0].text == "The user greets."
        assert message.type == "message" and response.output_text == "Hello!"
        assert (
            0 < response.usage.output_tokens_details.reasoning_tokens < response.usage.output_tokens
        )
        async with api.responses.stream(model="fake-model", input="w20 hi") as stream:
            deltas = [e.delta async for e in stream if e.type == "response.reasoning_text.delta"]
            final = await stream.get_final_response()
        assert "".join(deltas) == "The user greets." and final.output_text == "Hello!"
        await api.close()


async def test_a_tool_call_and_its_output_sent_back():
    async with fake_client(
        FakeEngine(script="Let me look.\n" + CALL), tool_parser="hermes"
    ) as client:
        body = {"input": "w20 weather?", "tools": [TOOL], "max_output_tokens": 100}
        first = await (await client.post(RESPONSES, json=body)).json()
        message, call = first["output"]
        assert message["content"][0]["text"] == "Let me look."
        assert call["type"] == "function_call" and call["name"] == "get_weather"
        assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
        assert json.loads(call["arguments"]) == {"city": "Paris"}
        r = await client.post(RESPONSES, json={**body, "stream": True})
        events = sse(await r.text())
        args = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
        assert "".join(e["delta"] for e in args) == call["arguments"]
        turn = [
            {"type": "message", "role": "user", "content": "w20 weather?"},
            *first["output"],
            {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
        ]
        r = await client.post(RESPONSES, json={**body, "input": turn})
        assert r.status == 200, await r.text()
        r = await client.post(RESPONSES, json={**body, "input": "w20", "tool_choice": "none"})
        (message,) = (await r.json())["output"]  # the markup stays text
        assert "<tool_call>" in message["content"][0]["text"]


async def test_max_output_tokens_makes_an_incomplete_response():
    async with fake_client(FakeEngine(script="A long answer that goes on.")) as client:
        body = {"input": "w20", "max_output_tokens": 2}
        whole = await (await client.post(RESPONSES, json=body)).json()
        assert whole["status"] == "incomplete"
        assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
        assert whole["output"][0]["status"] == "incomplete" and whole["usage"]["output_tokens"] == 2
        events = sse(await (await client.post(RESPONSES, json={**body, "stream": True})).text())
        assert events[-1]["type"] == "response.incomplete"
        assert streamed_text(events) == whole["output_text"]


async def test_previous_response_id_get_delete_and_keys():
    keys = [f"alice:{ALICE}", f"bob:{BOB}"]
    async with fake_client(FakeEngine(script="Noted."), api_key=keys) as client:
        alice = {"Authorization": f"Bearer {ALICE}"}
        bob = {"Authorization": f"Bearer {BOB}"}
        first = await (
            await client.post(RESPONSES, json={"input": "w20 w21"}, headers=alice)
        ).json()
        body = {"input": "w22", "previous_response_id": first["id"]}
        second = await (await client.post(RESPONSES, json=body, headers=alice)).json()
        alone = await (await client.post(RESPONSES, json={"input": "w22"}, headers=alice)).json()
        # the earlier turn (its input and output) came first
        assert second["usage"]["input_tokens"] > alone["usage"]["input_tokens"] + 2
        assert second["previous_response_id"] == first["id"]
        got = await client.get(f"{RESPONSES}/{first['id']}", headers=alice)
        assert got.status == 200 and (await got.json()) == first
        for method in (client.get, client.delete):
            r = await method(f"{RESPONSES}/{first['id']}", headers=bob)
            assert r.status == 404 and (await r.json())["error"]["param"] == "response_id"
        r = await client.post(RESPONSES, json=body, headers=bob)
        err = (await r.json())["error"]
        assert r.status == 400 and err["param"] == "previous_response_id"
        assert (await client.get(f"{RESPONSES}/{first['id']}")).status == 401
        r = await client.delete(f"{RESPONSES}/{first['id']}", headers=alice)
        assert (await r.json())["deleted"] is True
        assert (await client.get(f"{RESPONSES}/{first['id']}", headers=alice)).status == 404
        unkept = {"input": "w20", "store": False}
        unkept = await (await client.post(RESPONSES, json=unkept, headers=alice)).json()
        assert (await client.get(f"{RESPONSES}/{unkept['id']}", headers=alice)).status == 404


BAD = [
    ({}, "input"),
    ({"input": 3}, "input"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "mcp", "server_label": "s"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "x", "tools": [{**TOOL, "name": "bad name"}]}, "tools[0].name"),
    ({"input": "x", "tools": [{**TOOL, "parameters": {"type": "string"}}]}, "tools[0].parameters"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    (
        {"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}},
        "tool_choice",
    ),
    ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content[0].image_url",
    ),
    ({"input": [], "instructions": None}, "input"),
    (
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
        "text.format.schema",
    ),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 100_000}, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "nonsense": 1}, "nonsense"),
    ({"input": "x", "model": "other-model"}, "model"),
]


async def test_bad_bodies_get_a_400_naming_the_field():
    async with fake_client(FakeEngine(script="Fine.")) as client:
        for body, param in BAD:
            r = await client.post(RESPONSES, json=body)
            err = (await r.json())["error"]
            assert r.status in (400, 404) and err["param"] == param, (body, err)
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
        r = await client.post(RESPONSES, data=b'{"input": "\\ud800"}')
        assert r.status == 400 and (await r.json())["error"]["param"] == "input"
        r = await client.post(RESPONSES, json={"input": "w20"})
        assert r.status == 200 and (await r.json())["output_text"] == "Fine."


async def test_a_stall_after_the_stream_began_ends_with_error_and_failed():
    async with fake_client(stall_timeout=0.2) as client:
        r = await client.post(RESPONSES, json={"input": "w3 w20"})  # w3: one token, then stalls
        assert r.status == 504 and (await r.json())["error"]["code"] == "stall_timeout"
        r = await client.post(RESPONSES, json={"input": "w3 w20", "stream": True})
        events = sse(await r.text())
        error, failed = events[-2:]
        assert error["type"] == "error" and error["code"] == "stall_timeout"
        assert failed["type"] == "response.failed"
        response = failed["response"]
        assert response["status"] == "failed" and response["error"]["code"] == "stall_timeout"
        assert response["output_text"] == streamed_text(events) != ""
        r = await client.get(f"/v1/requests/{r.headers['X-Request-Id']}")
        assert (await r.json())["state"] == "timeout"
