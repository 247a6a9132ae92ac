"""The official openai client's Responses API against a real `appliance serve` on the embedded
model: create, stream (the streamed text is the final text), parse into a pydantic model, a
JSON schema, a forced tool call answered with function_call_output (in the input and through
previous_response_id), retrieve and delete, another key's 404, and a bad body's 400."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from tests.support.shared_server import KEYS, SERVED

openai = pytest.importorskip("openai")

MODEL = SERVED
ALICE, BOB = KEYS["alice"], KEYS["bob"]
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def server(shared_server):
    """The session's server (tests/support/shared_server.py), with alice's and bob's keys."""
    return shared_server.url


def connect(url: str, key: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def client(server):
    return connect(server, ALICE)


class Weather(BaseModel):
    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]
    temperature: int = Field(ge=-50, le=60)


def test_text_and_its_stream(client):
    ask = dict(
        model=MODEL,
        instructions="You are a helpful assistant.",
        input="Name three colours.",
        max_output_tokens=24,
        temperature=0,
    )
    response = client.responses.create(**ask)
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.usage.input_tokens > 0 and response.usage.output_tokens <= 24
    with client.responses.stream(**ask) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == response.output_text  # greedy: the same text


def test_parse_and_json_schema(client):
    parsed = client.responses.parse(
        model=MODEL,
        input="The weather in Rome today, as JSON.",
        text_format=Weather,
        max_output_tokens=80,
        temperature=0,
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Weather)
    schema = {
        "type": "object",
        "properties": {"colours": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["colours"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "colours", "schema": schema, "strict": True}
    response = client.responses.create(
        model=MODEL, input="Three colours.", text={"format": fmt}, max_output_tokens=60
    )
    assert len(json.loads(response.output_text)["colours"]) <= 3


def test_a_forced_tool_call_and_its_answer(client):
    first = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    assert isinstance(json.loads(call.arguments)["city"], str)
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}
    history = [{"role": "user", "content": "What is the weather in Paris?"}]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    again = client.responses.create(
        model=MODEL, input=[*history, answer], tools=[WEATHER_TOOL], max_output_tokens=30
    )
    assert again.status in ("completed", "incomplete") and again.output
    chained = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[answer],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_output_tokens=30,
    )
    assert chained.output_text and chained.previous_response_id == first.id
    assert chained.usage.input_tokens > first.usage.input_tokens  # the first turn came first
    named = client.responses.create(
        model=MODEL,
        input="Weather in Oslo?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=60,
    )
    assert [item.type for item in named.output] == ["function_call"]


def test_retrieve_delete_and_another_key(client, server):
    response = client.responses.create(model=MODEL, input="Hi.", max_output_tokens=4)
    assert client.responses.retrieve(response.id).output_text == response.output_text
    other = connect(server, BOB)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(response.id)
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_a_bad_body_is_a_400_and_the_server_serves_on(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="Hi.", tools=[{"type": "web_search"}])
    assert caught.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="Hi.", background=True)
    assert caught.value.body["param"] == "background"
    assert client.responses.create(model=MODEL, input="Hi.", max_output_tokens=4).output
