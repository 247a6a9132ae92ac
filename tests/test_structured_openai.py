"""The official openai client against a real `appliance serve` on the embedded model, asking for
structured outputs: parse() into a pydantic model, 24 JSON schemas validated with jsonschema,
forced tool calls whose arguments follow the function's parameters, streamed deltas that
assemble to the non-streamed answer, n > 1, the regex / choice / grammar extras on both
endpoints, and a bad schema refused with a 400 naming the keyword while the server serves on."""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.support.shared_server import KEYS, SERVED
from tests.support.structured_cases import (
    ASK_TOOLS,
    PARAMETERS,
    SCHEMAS,
    TOOLS,
    ask,
    obj,
    schema_format,
)

openai = pytest.importorskip("openai")

MODEL = SERVED
KEY = KEYS["structured"]


@pytest.fixture(scope="module")
def client(shared_server):
    """On the session's server (tests/support/shared_server.py), with a key of its own."""
    return openai.OpenAI(
        base_url=f"{shared_server.url}/v1", api_key=KEY, max_retries=0, timeout=300
    )


def _assert_valid_calls(message, names: set[str]) -> None:
    assert message.tool_calls, message
    assert not message.content  # no markup, no text beside a forced call
    for call in message.tool_calls:
        assert call.type == "function" and call.id and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


# --- JSON outputs ---------------------------------------------------------------------------------
class Weather(BaseModel):
    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]
    temperature: int = Field(ge=-50, le=60)
    sunny: bool


def test_parse_returns_a_pydantic_object(client):
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "The weather in Rome today, as JSON."}],
        response_format=Weather,
        max_tokens=80,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Weather)
    assert Weather.model_validate_json(choice.message.content) == choice.message.parsed


def test_parse_reads_a_forced_call_of_a_strict_pydantic_tool(client):
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Report the weather in Oslo."}],
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice={"type": "function", "function": {"name": "Weather"}},
        max_tokens=100,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    for call in choice.message.tool_calls:  # a named function: exactly one call of it
        assert call.function.name == "Weather"
        assert isinstance(call.function.parsed_arguments, Weather)


def test_json_schema_outputs_validate(client):
    def send(i: int):
        what, schema = SCHEMAS[i]
        return client.chat.completions.create(
            model=MODEL,
            messages=ask(what),
            response_format=schema_format(schema, f"schema_{i}"),
            max_tokens=80,
            temperature=0,
        )

    with ThreadPoolExecutor(len(SCHEMAS)) as pool:  # served as one batch
        completions = list(pool.map(send, range(len(SCHEMAS))))
    assert len(SCHEMAS) >= 20
    for (what, schema), completion in zip(SCHEMAS, completions):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", (what, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_and_n_choices(client):
    schema = SCHEMAS[1][1]
    completion = client.chat.completions.create(
        model=MODEL,
        messages=ask("a person"),
        response_format=schema_format(schema),
        n=3,
        seed=5,
        temperature=1.0,
        max_tokens=80,
    )
    assert [c.index for c in completion.choices] == [0, 1, 2]
    for choice in completion.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)
    anything = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person as a JSON object, name and age."}],
        response_format={"type": "json_object"},
        max_tokens=80,
        temperature=0,
    )
    assert isinstance(json.loads(anything.choices[0].message.content), dict)


# --- forced tool calls ----------------------------------------------------------------------------
def test_required_and_named_tool_choice_give_valid_calls(client):
    required = client.chat.completions.create(
        model=MODEL,
        messages=ASK_TOOLS,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        n=2,
        seed=3,
        temperature=0.8,
        max_tokens=100,
    )
    for choice in required.choices:
        assert choice.finish_reason == "tool_calls"
        _assert_valid_calls(choice.message, set(PARAMETERS))
        assert len(choice.message.tool_calls) == 1
    named = client.chat.completions.create(
        model=MODEL,
        messages=ASK_TOOLS,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False,
        n=2,
        seed=4,
        temperature=0.8,
        max_tokens=100,
    )
    for choice in named.choices:
        assert choice.finish_reason == "tool_calls"
        _assert_valid_calls(choice.message, {"add"})


def test_a_forced_call_cut_by_max_tokens_leaks_no_markup(client):
    """Parallel calls allowed, a weak model keeps calling until max_tokens ends it inside the
    next call's opening tag (40 and 80 tokens here, greedy)."""
    for max_tokens in (40, 80):
        kw = dict(
            model=MODEL,
            messages=ASK_TOOLS,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=max_tokens,
            temperature=0,
        )
        message = client.chat.completions.create(**kw).choices[0].message
        assert not message.content, (max_tokens, message.content)
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            jsonschema.validate(arguments, PARAMETERS[call.function.name])
        streamed = _assemble(client.chat.completions.create(**kw, stream=True))
        assert streamed[0]["content"] == "", (max_tokens, streamed[0]["content"])


# --- streaming ------------------------------------------------------------------------------------
def _assemble(chunks) -> dict[int, dict]:
    """Each choice's streamed deltas put together: content, calls (by index) and finish."""
    out: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            acc = out.setdefault(choice.index, {"content": "", "calls": {}, "finish": None})
            delta = choice.delta
            acc["content"] += delta.content or ""
            for part in delta.tool_calls or []:
                call = acc["calls"].get(part.index)
                if call is None:  # the first fragment of a call names it
                    assert part.id and part.type == "function" and part.function.name
                    call = acc["calls"][part.index] = {"name": part.function.name, "args": ""}
                else:
                    assert not (part.function and part.function.name)
                call["args"] += (part.function and part.function.arguments) or ""
            if choice.finish_reason is not None:
                acc["finish"] = choice.finish_reason
    return out


def _whole(completion) -> dict[int, dict]:
    return {
        c.index: {
            "content": c.message.content or "",
            "calls": {
                i: {"name": t.function.name, "args": t.function.arguments}
                for i, t in enumerate(c.message.tool_calls or [])
            },
            "finish": c.finish_reason,
        }
        for c in completion.choices
    }


@pytest.mark.parametrize(
    "request_kw",
    [
        dict(messages=ask("a person"), response_format=schema_format(SCHEMAS[1][1])),
        dict(messages=ask("one or two cities"), response_format=schema_format(SCHEMAS[8][1])),
        dict(messages=ASK_TOOLS, tools=TOOLS, tool_choice="required", parallel_tool_calls=False),
        dict(
            messages=ASK_TOOLS,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
    ids=["person", "cities", "required", "named"],
)
def test_streamed_deltas_assemble_to_the_whole_answer(client, request_kw):
    kw = dict(model=MODEL, n=2, seed=21, temperature=0.9, max_tokens=120, **request_kw)
    whole = _whole(client.chat.completions.create(**kw))
    streamed = _assemble(client.chat.completions.create(**kw, stream=True))
    assert streamed == whole
    for choice in whole.values():
        if "tools" in request_kw:
            assert choice["calls"] and choice["finish"] in ("tool_calls", "length")
        else:
            assert choice["finish"] == "stop"
            jsonschema.validate(
                json.loads(choice["content"]),
                request_kw["response_format"]["json_schema"]["schema"],
            )


# --- the extras, on both endpoints ----------------------------------------------------------------
GRAMMAR = (
    'start: "The answer is " n " (" unit ")."\n'
    'n: %json {"type": "integer", "minimum": 0, "maximum": 999}\n'
    'unit: "kg" | "g"\n'
)
GRAMMAR_SHAPE = r"The answer is ([0-9]+) \((kg|g)\)\."


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_regex_choice_and_grammar_extras(client, endpoint):
    def send(extra: dict) -> tuple[str, str]:
        if endpoint == "chat":
            c = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "How heavy is a cat?"}],
                max_tokens=40,
                temperature=0,
                extra_body=extra,
            ).choices[0]
            return c.message.content, c.finish_reason
        c = client.completions.create(
            model=MODEL, prompt="A cat weighs", max_tokens=40, temperature=0, extra_body=extra
        ).choices[0]
        return c.text, c.finish_reason

    text, finish = send({"regex": r"[0-9]{1,2} (kg|pounds)"})
    assert re.fullmatch(r"[0-9]{1,2} (kg|pounds)", text) and finish == "stop"
    text, finish = send({"choice": ["light", "heavy", "about four kilograms"]})
    assert text in ("light", "heavy", "about four kilograms") and finish == "stop"
    text, finish = send({"grammar": GRAMMAR})
    match = re.fullmatch(GRAMMAR_SHAPE, text)
    assert match and int(match[1]) <= 999 and finish == "stop"
    text, finish = send({"response_format": schema_format(SCHEMAS[7][1])})
    jsonschema.validate(json.loads(text), SCHEMAS[7][1])


def test_logprobs_of_a_constrained_output_are_plain_json(client):
    """Tokens the grammar ruled out have no finite logprob; the body stays standard JSON."""
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Is the sky blue?"}],
            "choice": ["yes", "no"],
            "logprobs": True,
            "top_logprobs": 5,
            "max_tokens": 5,
        }
    ).encode()
    req = urllib.request.Request(
        f"{client.base_url}chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        raw = resp.read().decode()

    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON: {raw}")

    answer = json.loads(raw, parse_constant=refuse)
    choice = answer["choices"][0]
    assert choice["message"]["content"] in ("yes", "no")
    for entry in choice["logprobs"]["content"]:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 5


# --- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, words, param",
    [
        ({"response_format": schema_format({"not": {"type": "string"}})}, ["not"], "schema"),
        (
            {"response_format": schema_format(obj(a={"$ref": "#/$defs/missing"}))},
            ["missing"],
            "schema",
        ),
        (
            {"response_format": schema_format({"type": "array", "uniqueItems": True})},
            ["uniqueItems"],
            "schema",
        ),
        ({"regex": "(unclosed"}, ["unclosed"], "regex"),
        ({"grammar": "start: no_such_rule"}, ["no_such_rule"], "grammar"),
        ({"regex": "a", "choice": ["a"]}, ["at most one"], "choice"),
    ],
    ids=["not", "ref", "uniqueItems", "regex", "grammar", "two"],
)
def test_a_bad_constraint_is_a_400_naming_it_and_the_server_serves_on(client, extra, words, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=ask("anything"), max_tokens=5, extra_body=extra
        )
    error = err.value.body
    assert err.value.status_code == 400
    assert all(w in error["message"] for w in words), error
    assert param in (error["param"] or ""), error
    ok = client.chat.completions.create(
        model=MODEL,
        messages=ask("a colour"),
        response_format=schema_format(SCHEMAS[0][1]),
        max_tokens=20,
        temperature=0,
    )
    assert json.loads(ok.choices[0].message.content)["color"] in ("red", "green", "blue")


def test_a_tool_whose_parameters_cannot_be_followed_is_a_400(client):
    tool = {
        "type": "function",
        "function": {"name": "pick", "parameters": {"type": "object", "not": {"required": ["x"]}}},
    }
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=ASK_TOOLS, tools=[tool], tool_choice="required", max_tokens=20
        )
    body = err.value.body  # the function whose parameters the library refuses, by place
    assert "not" in body["message"] and body["param"] == "tools[0].function.parameters"
