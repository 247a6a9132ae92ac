"""Property tests of the request parsers: no body, however odd, yields a 5xx or a hung request;
any text (lone surrogates, control characters, any code point) in any string field or key of
any route's body is answered below 500, and a lone surrogate with a 400 naming the field."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.server.schema.requests import ChatCompletionRequest, CompletionRequest
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
small_int = st.integers(-3, 40)
prob = st.floats(0.01, 1.0)
text = st.text(min_size=1, max_size=30)
token_ids = st.lists(st.integers(0, 511), min_size=1, max_size=6)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(max_size=20)}
    ),
    min_size=1,
    max_size=3,
)
# Mostly valid values, so that requests get past the first check and exercise the later ones.
VALID = {
    "model": st.just("fake-model"),
    "prompt": text | token_ids | st.lists(text | token_ids, min_size=1, max_size=2),
    "messages": messages,
    "max_tokens": st.integers(1, 20),
    "max_completion_tokens": st.integers(1, 20),
    "n": st.integers(1, 4),
    "best_of": st.integers(1, 4),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "temperature": st.floats(0, 2),
    "top_p": prob,
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 1),
    "repetition_penalty": st.floats(0.5, 2),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "seed": st.integers(0, 2**63 - 1),
    "stop": st.text(min_size=1, max_size=4) | st.lists(st.text(min_size=1, max_size=4), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 511), max_size=3),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "logprobs": st.integers(0, 5),
    "top_logprobs": st.integers(0, 5),
    "tokens": st.lists(st.integers(0, 511), max_size=6),
    "add_special_tokens": st.booleans(),
    "user": st.text(max_size=5),
}
JUNK = json_value | small_int | st.text(max_size=40) | st.lists(small_int, max_size=6)


def body_for(fields: set[str], required: list[str]):
    valid = st.fixed_dictionaries(
        {f: VALID[f] for f in required},
        optional={f: VALID[f] for f in sorted(fields) if f in VALID and f not in required},
    )
    if "messages" in fields and "logprobs" in fields:  # chat: logprobs is a boolean
        valid = valid.map(
            lambda d: {**d, "logprobs": bool(d["logprobs"])} if "logprobs" in d else d
        )
    junk = st.dictionaries(st.sampled_from(sorted(fields) + ["unknown_field"]), JUNK, max_size=2)
    return st.tuples(valid, junk, st.booleans()).map(lambda t: {**t[0], **t[1]} if t[2] else t[0])


ENDPOINTS = {
    "/v1/completions": body_for(set(CompletionRequest.model_fields), ["prompt"]),
    "/v1/chat/completions": body_for(set(ChatCompletionRequest.model_fields), ["messages"]),
    "/tokenize": body_for({"model", "prompt", "add_special_tokens"}, ["prompt"])
    | body_for({"model", "messages"}, ["messages"]),
    "/detokenize": body_for({"model", "tokens"}, ["tokens"]),
}


def payload(path: str):
    return (
        ENDPOINTS[path].map(lambda d: json.dumps(d).encode())
        | json_value.map(lambda v: json.dumps(v).encode())
        | st.binary(max_size=40)
    )


@pytest.fixture(scope="module")
def served():
    """(runner, client) on the fake engine, shared by this module's tests."""
    with asyncio.Runner() as runner:
        engine = FakeEngine(step_time=0.0, markers=False)
        cm = fake_client(engine, max_n=8)
        client = runner.run(cm.__aenter__())
        try:
            yield runner, client
        finally:
            runner.run(cm.__aexit__(None, None, None))


def post(served, path: str, data: bytes, timeout_s: float = 10) -> tuple[int, bytes]:
    runner, client = served

    async def send():
        r = await client.post(path, data=data)
        return r.status, await r.read()

    return runner.run(asyncio.wait_for(send(), timeout_s))


def assert_idle(served) -> None:
    """Nothing left running: every request of the test ended and freed its KV blocks."""
    runner, client = served
    stats = runner.run(client.get("/v1/stats"))
    body = runner.run(stats.json())
    assert body["requests_in_flight"] == 0 and body["engine"]["kv_blocks_used"] == 0


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_no_input_yields_a_5xx_or_hangs(served, path):
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(payload(path))
    def check(data):
        status, text = post(served, path, data)
        assert status < 500, (path, data, text)
        if status >= 400:
            assert "error" in json.loads(text)

    check()
    assert_idle(served)


# --- any text in any string field ------------------------------------------------------------
ODD_TEXT = [
    "\ud800",  # a lone high surrogate
    "\udfff",  # a lone low one
    "ok\ud83d",  # a high one cut from its pair
    "\ude00\ud83d",  # a pair in the wrong order
    "\ud83d\ude00",  # a pair: as JSON escapes it is one character, U+1F600
    "\x00",
    "\x7f\x1b[31m\x08",
    "\r\n\t\x0b\x0c",
    "\ufeff",
    "\ufffe\uffff",
    "\u2028\u2029",
    "e\u0301\u0308",
    "\u202eevil",
    "\U0010ffff\U000e0001",
    "",
    " ",
]
"""Text a hand picks: the surrogate cases each side of the rule, controls, non-characters,
line separators, combining and bidi marks, the last code points."""
any_text = (
    st.text(st.characters(exclude_categories=()), max_size=8)  # surrogates (Cs) included
    | st.sampled_from(ODD_TEXT)
    | st.tuples(st.text(max_size=6), st.sampled_from(ODD_TEXT)).map("".join)
)
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "where", "enum": ["Oslo"]}},
            "required": ["city"],
        },
    },
}
SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "description": "one word",
        "schema": {"type": "object", "properties": {"word": {"type": "string", "pattern": "^w"}}},
    },
}
EXTRAS = {
    "user": "u1",
    "metadata": {"team": "blue"},
    "service_tier": "auto",
    "cache_salt": "salt",
    "model": "fake-model",
    "stop": ["w9", "end"],
    "max_tokens": 3,
}
CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "w5 w6"}], "name": "ann"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call1", "content": "4 C"},
    {"role": "user", "content": "w7"},
]
BODIES = {
    "/v1/completions": [
        {"prompt": "w1 w2", **EXTRAS},
        {"prompt": ["w1", "w2 w3"], "regex": "w[0-9]+", "max_tokens": 2},
        {"prompt": "w1", "grammar": 'start: "w1" | "w2"', "max_tokens": 2},
        {"prompt": "w1", "choice": ["yes", "no"], "max_tokens": 2},
        {"prompt": "w1", "response_format": SCHEMA_FORMAT, "max_tokens": 2},
    ],
    "/v1/chat/completions": [
        {
            "messages": CHAT,
            "tools": [TOOL],
            "tool_choice": "auto",
            "chat_template_kwargs": {"enable_thinking": False, "note": "hi"},
            **EXTRAS,
        },
        {
            "messages": CHAT[-1:],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        {"messages": CHAT[-1:], "response_format": SCHEMA_FORMAT, "stop": "w9"},
        {"messages": CHAT[-1:], "grammar": 'start: "w1"', "stream": True, "max_tokens": 2},
    ],
    "/tokenize": [
        {"prompt": "w1 w2", "model": "fake-model"},
        {"messages": CHAT, "model": "fake-model"},
    ],
    "/detokenize": [{"tokens": [5, 6], "model": "fake-model"}],
}
"""Valid bodies that reach far (templates, tools, grammars, stop strings) for the text to go in."""


def string_slots(value, path: tuple = ()) -> list[tuple[tuple, bool]]:
    """(path, is_key) of every string in a JSON value and of every object key."""
    if isinstance(value, str):
        return [(path, False)]
    if isinstance(value, list):
        return [slot for i, v in enumerate(value) for slot in string_slots(v, (*path, i))]
    if isinstance(value, dict):
        return [
            slot
            for k, v in value.items()
            for slot in [((*path, k), True), *string_slots(v, (*path, k))]
        ]
    return []


def with_text(body: dict, slot: tuple[tuple, bool], text: str) -> dict:
    """A copy of `body` with the string (or the key) at `slot` replaced by `text`."""
    path, is_key = slot
    out = copy.deepcopy(body)
    parent = out
    for part in path[:-1]:
        parent = parent[part]
    if is_key:
        parent[text] = parent.pop(path[-1])
    else:
        parent[path[-1]] = text
    return out


def _dotted(path: tuple) -> str | None:
    """The JSON path an error's param names: ('messages', 0, 'content') -> messages[0].content."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out or None


def _is_utf8_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text_requests(bodies: list[tuple[str, dict]]):
    """(path, body, slot, text, ascii): a route's body with any text in one of its string slots
    (a value three times in four, else a key), to be sent with JSON escapes (ascii, three times
    in four) or as raw UTF-8 (a surrogate then as its three bytes, which are not UTF-8)."""

    def slot_in(route: tuple[str, dict]):
        slots = string_slots(route[1])
        values = st.sampled_from([s for s in slots if not s[1]])
        keys = st.sampled_from([s for s in slots if s[1]])
        return st.tuples(st.just(route), values | values | values | keys)

    requests = st.sampled_from(bodies).flatmap(slot_in)
    ascii = st.sampled_from([True, True, True, False])  # raw UTF-8 ends at the first check
    return st.tuples(requests, any_text, ascii).map(lambda t: (*t[0][0], t[0][1], t[1], t[2]))


def encoded(body: dict, ascii: bool) -> bytes:
    return json.dumps(body, ensure_ascii=ascii).encode("utf-8", "surrogatepass")


def check_text_answer(slot, text: str, ascii: bool, status: int, raw: bytes) -> None:
    """Below 500, in the envelope; a lone surrogate is a 400: invalid UTF-8 sent raw, else a
    message naming its field (or, in a key, the object holding it)."""
    assert status < 500, (slot, text, raw)
    if status >= 400:
        assert set(json.loads(raw)["error"]) == {"message", "type", "param", "code"}, raw
    decoded = json.loads(json.dumps(text))  # what the server reads of an escaped text
    if _is_utf8_text(text if not ascii else decoded):
        return
    err = json.loads(raw)["error"]
    assert status == 400, (slot, text, raw)
    if not ascii:
        assert "not valid UTF-8" in err["message"], err
        return
    path, is_key = slot
    assert "is not valid Unicode" in err["message"], err
    assert err["param"] == _dotted(path[:-1] if is_key else path), (slot, err)


@pytest.mark.parametrize("path", sorted(BODIES))
def test_any_text_in_any_string_field_is_answered_below_500(served, path):
    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(request=text_requests([(path, body) for body in BODIES[path]]))
    def check(request):
        _, body, slot, text, ascii = request
        status, raw = post(served, path, encoded(with_text(body, slot, text), ascii))
        check_text_answer(slot, text, ascii, status, raw)

    for body in BODIES[path]:  # each base body is served as it is (a 400 only where the fake
        status, raw = post(served, path, encoded(body, True))  # engine has no grammars)
        assert status == 200 or b"structured outputs need" in raw, raw
    check()
    assert_idle(served)
