"""The official anthropic client against a real `appliance serve` on the embedded model, with an
API key and `--model-alias 'claude-*=...'` as Claude Code needs them: a message, a stream whose
text is the final message's, a forced tool call answered with a tool_result, count_tokens, a
wrong key and a bad body answered in Anthropic's envelope while the server serves on."""

from __future__ import annotations

import pytest

from tests.support.shared_server import KEYS, SERVED

anthropic = pytest.importorskip("anthropic")

KEY = KEYS["claude"]
MODEL = "claude-sonnet-4-5"
TOOLS = [
    {
        "name": "get_weather",
        "description": "The current weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}
"""The client of this version has no temperature argument; the API still takes the field."""


@pytest.fixture(scope="module")
def server(shared_server):
    """The session's server (tests/support/shared_server.py), with this key and the alias."""
    return shared_server.url


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0, timeout=300)


def test_a_message_and_its_stream(client):
    request = dict(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY)
    message = client.messages.create(**request)
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    (block,) = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 10
    with client.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == block.text  # greedy: the same answer
    assert final.usage.output_tokens == message.usage.output_tokens
    assert final.usage.cache_read_input_tokens > 0  # the same prompt again: the prefix cache


def test_a_forced_tool_call_then_its_result(client):
    # one call each: with parallel calls allowed, a tiny model writes calls until max_tokens
    for choice in (
        {"type": "any", "disable_parallel_tool_use": True},
        {"type": "tool", "name": "get_weather"},
    ):
        message = client.messages.create(
            model=MODEL,
            max_tokens=60,
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            extra_body=GREEDY,
        )
        assert message.stop_reason == "tool_use", message
        (call,) = message.content
        assert (
            call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
        )
        assert isinstance(call.input.get("city"), str)
    turns = ASK + [
        {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"}],
        },
    ]
    answer = client.messages.create(
        model=MODEL, max_tokens=30, messages=turns, tools=TOOLS, tool_choice={"type": "none"}
    )
    assert answer.content[0].type == "text" and answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens")


def test_count_tokens_is_the_prompt_a_message_gets(client):
    counted = client.messages.count_tokens(model=MODEL, messages=ASK, system="Be brief.")
    message = client.messages.create(model=MODEL, max_tokens=1, messages=ASK, system="Be brief.")
    u = message.usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens


def test_a_wrong_key_and_a_bad_body_in_anthropic_envelope(server, client):
    wrong = anthropic.Anthropic(base_url=server, api_key="sk-wrong-key-0", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        wrong.messages.create(model=MODEL, max_tokens=5, messages=ASK)
    assert auth.value.status_code == 401
    assert auth.value.body["error"] == {
        "type": "authentication_error",
        "message": "invalid API key",
    }
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=5, messages=ASK, extra_body={"top_k": 0})
    assert bad.value.body["type"] == "error"
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "top_k" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError, match="--model-alias"):
        client.messages.create(model="gpt-4o", max_tokens=5, messages=ASK)
    assert client.messages.create(model=SERVED, max_tokens=3, messages=ASK).content
