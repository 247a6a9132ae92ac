"""/v1/messages and /v1/messages/count_tokens through the official anthropic client, on a fake
engine that writes a scripted answer: thinking blocks from a reasoning template, tool_use
blocks parsed from a model's call markup, stop reasons, errors in Anthropic's envelope (and the
server serving on after them), x-api-key, and --model-alias."""

from __future__ import annotations

import pytest

from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client

anthropic = pytest.importorskip("anthropic")

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ASK = [{"role": "user", "content": "w20 weather?"}]
MESSAGES = "/v1/messages"


def sdk(client, **kwargs):
    base = str(client.make_url("")).rstrip("/")
    return anthropic.AsyncAnthropic(base_url=base, api_key="unused", max_retries=0, **kwargs)


async def whole_and_streamed(api, **request):
    message = await api.messages.create(**request)
    async with api.messages.stream(**request) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    return message, final, text


async def test_thinking_blocks_from_a_reasoning_template():
    script = "<think>\nThe user greets.\n</think>\n\nHello!"
    engine = FakeEngine(script=script, chat_template="{{ messages }} <think>")
    async with fake_client(engine) as client:
        request = dict(
            model="fake-model",
            max_tokens=100,
            messages=ASK,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
        message, final, text = await whole_and_streamed(sdk(client), **request)
        thinking, answer = message.content
        assert thinking.type == "thinking" and thinking.thinking == "The user greets."
        assert thinking.signature and answer.type == "text" and answer.text == "Hello!"
        assert message.stop_reason == "end_turn" and message.id.startswith("msg_")
        assert [b.model_dump() for b in final.content] == [b.model_dump() for b in message.content]
        assert text == "Hello!"
        # the thinking block goes back in the next turn (as reasoning_content), and is accepted
        turns = ASK + [
            {"role": "assistant", "content": [b.model_dump() for b in message.content]},
            {"role": "user", "content": "w21 and tomorrow?"},
        ]
        again = await sdk(client).messages.create(**{**request, "messages": turns})
        assert again.content[-1].text == "Hello!"


async def test_a_tool_call_becomes_a_tool_use_block_whole_and_streamed():
    engine = FakeEngine(script="Let me look.\n" + CALL)
    async with fake_client(engine, tool_parser="hermes") as client:
        request = dict(model="fake-model", max_tokens=100, messages=ASK, tools=TOOLS)
        message, final, text = await whole_and_streamed(sdk(client), **request)
        answer, call = message.content
        assert answer.text == "Let me look." == text and message.stop_reason == "tool_use"
        assert call.type == "tool_use" and call.id.startswith("toolu_")
        assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
        assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
            ("text", None),
            ("tool_use", {"city": "Paris"}),
        ]
        assert final.stop_reason == "tool_use"
        # the result goes back; an error result too
        for is_error in (False, True):
            result = {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}
            turns = ASK + [
                {"role": "assistant", "content": [b.model_dump() for b in message.content]},
                {"role": "user", "content": [{**result, "is_error": is_error}]},
            ]
            answered = await sdk(client).messages.create(**{**request, "messages": turns})
            assert answered.stop_reason == "tool_use"


async def test_stop_reasons_usage_and_count_tokens():
    engine = FakeEngine(script="one two END three")
    async with fake_client(engine) as client:
        api = sdk(client)
        request = dict(model="fake-model", max_tokens=100, messages=ASK)
        stopped = await api.messages.create(**request, stop_sequences=["END"])
        assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "END"
        assert stopped.content[0].text == "one two "
        cut = await api.messages.create(**{**request, "max_tokens": 2})
        assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
        whole = await api.messages.create(**request, system=[{"type": "text", "text": "Be w9"}])
        assert whole.stop_reason == "end_turn" and whole.content[0].text == "one two END three"
        counted = await api.messages.count_tokens(
            model="fake-model", messages=ASK, system=[{"type": "text", "text": "Be w9"}]
        )
        u = whole.usage
        assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens > 0
        assert u.cache_creation_input_tokens == 0


async def expect(response, status: int, kind: str, words: str) -> None:
    body = await response.json()
    assert response.status == status, body
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert words in body["error"]["message"], body


BAD_BODIES = [
    ({"model": "fake-model", "messages": ASK}, "'max_tokens' is required"),
    ({"model": "fake-model", "max_tokens": 5, "messages": []}, "non-empty list"),
    ({"model": "fake-model", "max_tokens": 5, "messages": ASK, "n": 2}, "Unrecognized"),
    ({"model": "fake-model", "max_tokens": 5, "messages": ASK, "temperature": 1.5}, "[0.0, 1.0]"),
    (
        {
            "model": "fake-model",
            "max_tokens": 5,
            "messages": ASK + [{"role": "assistant", "content": "Hi"}],
        },
        "prefill",
    ),
    (
        {
            "model": "fake-model",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
        },
        "documents are not supported",
    ),
    (
        {
            "model": "fake-model",
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}
            ],
        },
        "answers no tool_use block",
    ),
    (
        {"model": "fake-model", "max_tokens": 5, "messages": ASK, "tool_choice": {"type": "any"}},
        "needs tools",
    ),
    (
        {
            "model": "fake-model",
            "max_tokens": 5,
            "messages": ASK,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        "is a server tool",
    ),
    (
        {"model": "fake-model", "max_tokens": 5, "messages": ASK, "mcp_servers": [{}]},
        "not supported",
    ),
]


async def test_bad_bodies_get_a_400_in_anthropic_envelope_and_the_server_serves_on():
    async with fake_client(FakeEngine(script="ok")) as client:
        for body, words in BAD_BODIES:
            await expect(
                await client.post(MESSAGES, json=body), 400, "invalid_request_error", words
            )
        r = await client.post(MESSAGES, data=b"{not json", headers={"anthropic-version": "x"})
        await expect(r, 400, "invalid_request_error", "not valid JSON")
        body = {"model": "fake-model", "max_tokens": 5, "messages": ASK}
        headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "whatever-2099-01-01"}
        r = await client.post(MESSAGES, json=body, headers=headers)
        assert r.status == 200 and (await r.json())["content"][0]["text"] == "ok"
        with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
            await sdk(client).messages.create(model="fake-model", max_tokens=0, messages=ASK)


async def test_x_api_key_a_wrong_key_and_the_keys_limits():
    keys = {"alice": {"rpm": 3}}
    async with fake_client(
        FakeEngine(script="ok"), api_key=["alice:sk-alice-1"], keys=keys
    ) as client:
        body = {"model": "fake-model", "max_tokens": 5, "messages": ASK}
        ok = await client.post(MESSAGES, json=body, headers={"x-api-key": "sk-alice-1"})
        assert ok.status == 200, await ok.text()
        bearer = await client.post(
            MESSAGES, json=body, headers={"Authorization": "Bearer sk-alice-1"}
        )
        assert bearer.status == 200
        r = await client.post(MESSAGES, json=body, headers={"x-api-key": "sk-bob-22"})
        await expect(r, 401, "authentication_error", "invalid API key")
        r = await client.post(MESSAGES, json=body)
        await expect(r, 401, "authentication_error", "x-api-key")
        with pytest.raises(anthropic.AuthenticationError):
            await sdk(client).messages.create(**body)
        message = (
            await sdk(client, auth_token=None)
            .with_options(api_key="sk-alice-1")
            .messages.create(**body)
        )
        assert message.content[0].text == "ok"
        r = await client.post(MESSAGES, json=body, headers={"x-api-key": "sk-alice-1"})
        await expect(r, 429, "rate_limit_error", "3 requests per minute")
        assert r.headers["x-ratelimit-limit-requests"] == "3" and "Retry-After" in r.headers


async def test_model_aliases_on_every_route():
    settings = {"model_alias": ["claude-*=fake-model", "gpt-x=other-model"]}
    async with fake_client(FakeEngine(script="ok"), **settings) as client:
        body = {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": ASK}
        r = await client.post(MESSAGES, json=body)
        assert r.status == 200 and (await r.json())["model"] == "claude-sonnet-4-5"
        chat = {"model": "claude-opus-4-1", "messages": ASK, "max_tokens": 5}
        assert (await client.post("/v1/chat/completions", json=chat)).status == 200
        r = await client.post(MESSAGES, json={**body, "model": "gpt-x"})
        await expect(r, 404, "not_found_error", "maps the model 'gpt-x' to 'other-model'")
    async with fake_client(FakeEngine(script="ok")) as client:
        r = await client.post(MESSAGES, json=body)
        await expect(r, 404, "not_found_error", "--model-alias 'claude-*=fake-model'")
        r = await client.post("/v1/chat/completions", json={**chat, "model": "claude-x"})
        assert r.status == 404 and "--model-alias" in (await r.json())["error"]["message"]


def test_a_conversation_becomes_the_chat_templates_messages():
    from appliance.server.anthropic_api.convert import generate_request
    from appliance.server.anthropic_api.schema import MessagesRequest

    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 9,
            "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            "thinking": {"type": "enabled", "budget_tokens": 2000},
            "tools": TOOLS,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, call],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True},
                        {"type": "text", "text": "go on"},
                    ],
                },
            ],
        }
    )
    req = generate_request(body)
    assert req.template_kwargs == {"enable_thinking": True}
    assert (req.tool_choice, req.parallel_tool_calls) == ("required", False)
    assert req.tools[0]["function"]["parameters"] == TOOLS[0]["input_schema"]
    assert req.messages == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
            "reasoning_content": "t",
        },
        {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "Error: "},
        {"role": "user", "content": "go on"},
    ]
    plain = generate_request(
        MessagesRequest.model_validate(
            {**body.model_dump(), "thinking": None, "tools": None, "tool_choice": None}
        )
    )
    assert plain.template_kwargs == {"enable_thinking": False} and plain.tools is None
