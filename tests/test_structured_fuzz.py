"""Property test of structured outputs through the HTTP server on a tiny random-weight model:
whatever JSON schema or tool definitions a request sends, the answer is never a 5xx, and an
output that the server ended itself (finish_reason other than "length") follows its schema.
Any text (lone surrogates, control characters, any code point) in a regex, grammar, choice,
schema, tool, message or prompt reaches the real tokenizer, chat template and grammar library
and is answered below 500.

The model's weights are random, so only the grammar makes an output valid; its steps take a
few milliseconds on the CPU, so each example is a real generation."""

from __future__ import annotations

import asyncio
import contextlib
import json

import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.server import create_app
from appliance.settings import ServeSettings
from tests.support.fake_server import sse_events, wait_until_served
from tests.test_server_fuzz import (
    CHAT,
    SCHEMA_FORMAT,
    TOOL,
    check_text_answer,
    encoded,
    json_value,
    text_requests,
    with_text,
)

MAX_TOKENS = 96
MAX_TOOL_TOKENS = 192
"""A byte-level tokenizer: the call markup alone takes about 40 tokens."""
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))

# --- schemas --------------------------------------------------------------------------------------
small = st.integers(-20, 20)
names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=6)
leaf_values = st.none() | st.booleans() | small | st.text("abc xyz", max_size=4)


@st.composite
def _bounds(draw, kind: str) -> dict:
    lo, hi = sorted([draw(small), draw(small)])
    out = {"type": kind}
    if draw(st.booleans()):
        out["minimum"] = lo
    if draw(st.booleans()):
        out["maximum"] = hi
    if kind == "number" and draw(st.booleans()):
        out["multipleOf"] = draw(st.sampled_from([0.5, 0.25, 2]))
    return out


@st.composite
def _string(draw) -> dict:
    out = {"type": "string", "maxLength": draw(st.integers(0, 8))}
    if draw(st.booleans()):
        out["minLength"] = draw(st.integers(0, out["maxLength"]))
    if draw(st.booleans()):
        out = {"type": "string", "pattern": draw(st.sampled_from(PATTERNS))}
    return out


PATTERNS = ["^[a-z]{1,4}$", "^[0-9]{2}-[A-Z]$", "^(yes|no)$", "^x*$", "^[a-f0-9]{0,6}$"]
leaf_schemas = st.one_of(
    _string(),
    _bounds("integer"),
    _bounds("number"),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(leaf_values, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
    leaf_values.map(lambda v: {"const": v}),
    _string().map(lambda s: {**s, "type": ["string", "null"]}),
)


@st.composite
def _object(draw, children) -> dict:
    props = draw(st.dictionaries(names, children, max_size=3))
    required = [k for k in props if draw(st.booleans())]
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": draw(st.sampled_from([False, False, False, True])),
    }


@st.composite
def _array(draw, children) -> dict:
    lo = draw(st.integers(0, 2))
    return {
        "type": "array",
        "items": draw(children),
        "minItems": lo,
        "maxItems": lo + draw(st.integers(0, 2)),
    }


schemas = st.recursive(
    leaf_schemas,
    lambda children: (
        _object(children)
        | _array(children)
        | st.lists(children, min_size=1, max_size=3).map(lambda c: {"anyOf": c})
    ),
    max_leaves=6,
)
UNUSABLE = [
    {"not": {"type": "string"}},
    {"uniqueItems": True},
    {"if": {"type": "string"}, "then": {"maxLength": 1}},
    {"$ref": "#/$defs/nowhere"},
    {"type": "strin"},
    {"minimum": 5, "maximum": 3, "type": "integer"},
    {"minLength": 4, "maxLength": 2, "type": "string"},
    {"enum": []},
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    {"pattern": "(unclosed", "type": "string"},
]
"""Keywords or values the grammar library refuses: each must be a 400, never a 5xx."""
any_schema = (
    schemas
    | st.tuples(schemas, st.sampled_from(UNUSABLE)).map(lambda t: {**t[0], **t[1]})
    | st.dictionaries(st.text(max_size=8), json_value, max_size=3)
)
object_schema = st.one_of(_object(schemas), st.just({"type": "object"}), st.none())


# --- the server -----------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def _serving(folder):
    app = create_app(
        ServeSettings(model=str(folder), device="cpu", warmup=False, max_model_len=512)
    )
    async with TestClient(TestServer(app)) as client:
        await wait_until_served(client)
        yield client


@pytest.fixture(scope="module")
def served(tiny_llama):
    """(runner, client) on a real engine in its core process, serving the tiny model."""
    with asyncio.Runner() as runner:
        cm = _serving(tiny_llama)
        client = runner.run(cm.__aenter__())
        try:
            yield runner, client
        finally:
            runner.run(cm.__aexit__(None, None, None))


def _post(served, path: str, body: dict) -> tuple[int, str]:
    runner, client = served

    async def post():
        r = await client.post(path, json=body)
        return r.status, await r.text()

    return runner.run(asyncio.wait_for(post(), 60))


def _choices(body: dict, status: int, text: str) -> list[dict]:
    """[{"content", "calls", "finish"}] of a 200 answer, streamed or not; fails on a 5xx."""
    assert status < 500, (body, text)
    if status != 200:
        assert "error" in json.loads(text), text
        return []
    if not body.get("stream"):
        out = []
        for c in json.loads(text)["choices"]:
            message = c.get("message") or {}
            calls = [
                (t["function"]["name"], t["function"]["arguments"])
                for t in message.get("tool_calls") or []
            ]
            out.append(
                {
                    "content": c.get("text", message.get("content")),
                    "calls": calls,
                    "finish": c["finish_reason"],
                }
            )
        return out
    acc: dict[int, dict] = {}
    for event in sse_events(text):
        for c in event["choices"]:
            a = acc.setdefault(c["index"], {"content": "", "calls": {}, "finish": None})
            delta = c.get("delta", {})
            a["content"] += c.get("text") or delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                call = a["calls"].setdefault(part["index"], ["", ""])
                call[0] += part.get("function", {}).get("name") or ""
                call[1] += part.get("function", {}).get("arguments") or ""
            a["finish"] = c.get("finish_reason") or a["finish"]
    return [
        {**a, "calls": [tuple(v) for _, v in sorted(a["calls"].items())]}
        for _, a in sorted(acc.items())
    ]


def _sampling(draw, max_tokens: int) -> dict:
    return {
        "max_tokens": max_tokens,
        "n": draw(st.integers(1, 2)),
        "temperature": draw(st.sampled_from([0.0, 0.7, 1.0, 1.5])),
        "seed": draw(st.integers(0, 2**31)),
        "stream": draw(st.booleans()),
    }


@st.composite
def schema_requests(draw) -> tuple[str, dict, dict | None]:
    schema = draw(any_schema)
    body = {
        **_sampling(draw, MAX_TOKENS),
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    if draw(st.booleans()):
        return (
            "/v1/chat/completions",
            {**body, "messages": [{"role": "user", "content": "go"}]},
            schema,
        )
    return "/v1/completions", {**body, "prompt": "go"}, schema


def _checkable(schema: dict) -> bool:
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return True


@FUZZ
@given(request=schema_requests())
def test_a_schema_gets_a_400_or_outputs_that_follow_it(served, request):
    path, body, schema = request
    status, text = _post(served, path, body)
    for choice in _choices(body, status, text):
        assert choice["finish"] in ("stop", "length"), choice
        if choice["finish"] == "stop" and _checkable(schema):
            jsonschema.validate(json.loads(choice["content"]), schema)


# --- tools ----------------------------------------------------------------------------------------
good_names = st.from_regex(r"[a-j_][a-j_.-]{0,7}", fullmatch=True)
bad_names = st.sampled_from(["", "bad name", "é", "a" * 65])


@st.composite
def tool_requests(draw) -> tuple[dict, dict]:
    functions = {}
    for _ in range(draw(st.integers(1, 3))):  # one name in ten is refused
        name = draw(bad_names if draw(st.integers(0, 9)) == 5 else good_names)
        functions[name] = draw(object_schema)
    tools = []
    for name, params in functions.items():
        function = {"name": name} if params is None else {"name": name, "parameters": params}
        if draw(st.integers(0, 7)) == 5:  # parameters the grammar library refuses
            function = {
                **function,
                "parameters": {**(params or {}), **draw(st.sampled_from(UNUSABLE))},
            }
        tools.append({"type": "function", "function": function})
    choice = draw(st.sampled_from(["required", "auto", "none", "named"]))
    if choice == "named":
        named = draw(st.sampled_from([*functions, "not_a_tool"]))
        choice = {"type": "function", "function": {"name": named}}
    body = {
        **_sampling(draw, MAX_TOOL_TOKENS),
        "messages": [{"role": "user", "content": "call something"}],
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": draw(st.booleans()),
    }
    return body, {t["function"]["name"]: t["function"].get("parameters") for t in tools}


@FUZZ
@given(request=tool_requests())
def test_tools_get_a_400_or_forced_calls_that_follow_their_parameters(served, request):
    body, parameters = request
    status, text = _post(served, "/v1/chat/completions", body)
    forced = body["tool_choice"] if body["tool_choice"] != "auto" else None
    for choice in _choices(body, status, text):
        assert choice["finish"] in ("stop", "length", "tool_calls"), choice
        if forced in (None, "none") or choice["finish"] == "length":
            continue
        assert choice["calls"] and choice["finish"] == "tool_calls", choice
        assert not choice["content"], choice
        for name, arguments in choice["calls"]:
            assert name in parameters
            if isinstance(forced, dict):
                assert name == forced["function"]["name"]
            schema = parameters[name] or {"type": "object"}
            if _checkable(schema):
                jsonschema.validate(json.loads(arguments), schema)
        if body["parallel_tool_calls"] is False:
            assert len(choice["calls"]) == 1


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "integer", "minimum": 0, "maximum": 9},
        {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    ],
    ids=["integer", "array", "oneOf"],
)
def test_a_forced_call_whose_parameters_are_not_an_object_is_refused_or_returned(
    served, parameters
):
    """OpenAI's parameters are an object schema; a forced call of another kind must be a 400
    naming it, or a call in the answer (never an answer with neither)."""
    body = {
        "messages": [{"role": "user", "content": "call it"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": MAX_TOOL_TOKENS,
        "temperature": 0,
    }
    status, text = _post(served, "/v1/chat/completions", body)
    if status == 400:
        assert "parameters" in json.loads(text)["error"]["message"], text
        return
    (choice,) = _choices(body, status, text)
    assert choice["finish"] == "tool_calls" and choice["calls"], (parameters, text)
    ((name, arguments),) = choice["calls"]
    jsonschema.validate(json.loads(arguments), parameters)


# --- any text where the grammar library, the tokenizer and the template read it -------------------
ASK = [{"role": "user", "content": "answer"}]
TEXT_BODIES = [
    ("/v1/chat/completions", {"messages": CHAT, "regex": "[a-z]{1,3}", "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": ASK, "grammar": 'start: "yes" | "no"', "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": ASK, "choice": ["yes", "no"], "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": ASK, "response_format": SCHEMA_FORMAT, "max_tokens": 4}),
    (
        "/v1/chat/completions",
        {"messages": ASK, "tools": [TOOL], "tool_choice": "required", "max_tokens": 4},
    ),
    ("/v1/completions", {"prompt": "once upon", "stop": ["x", "yz"], "max_tokens": 4}),
    ("/tokenize", {"messages": CHAT}),
    ("/tokenize", {"prompt": "hello"}),
]
"""Bodies the tiny model answers with 200 as they are; any text goes into one string slot."""


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=text_requests(TEXT_BODIES))
def test_any_text_in_a_grammar_tool_or_prompt_is_answered_below_500(served, request):
    path, body, slot, text, ascii = request
    runner, client = served

    async def post():
        r = await client.post(path, data=encoded(with_text(body, slot, text), ascii))
        return r.status, await r.read()

    status, raw = runner.run(asyncio.wait_for(post(), 60))
    check_text_answer(slot, text, ascii, status, raw)


@pytest.mark.parametrize("path, body", TEXT_BODIES, ids=lambda v: v if isinstance(v, str) else "")
def test_the_text_fuzz_bodies_are_served_as_they_are(served, path, body):
    status, text = _post(served, path, body)
    assert status == 200, text
