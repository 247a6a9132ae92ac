"""Property test of the request parsers: no body, however odd, yields a 5xx or a hung request."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.server.schema.requests import ChatCompletionRequest, CompletionRequest
from tests.support.fake_engine import FakeEngine, fake_client

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


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_no_input_yields_a_5xx_or_hangs(path):
    with asyncio.Runner() as runner:
        engine = FakeEngine(step_time=0.0, markers=False)
        cm = fake_client(engine, max_n=8)
        client = runner.run(cm.__aenter__())
        try:

            @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(payload(path))
            def check(data):

                async def post():
                    r = await client.post(path, data=data)
                    return r.status, await r.read()

                status, text = runner.run(asyncio.wait_for(post(), 10))
                assert status < 500, (path, data, text)
                if status >= 400:
                    assert "error" in json.loads(text)

            check()
            stats = runner.run(client.get("/v1/stats"))
            body = runner.run(stats.json())
            assert body["requests_in_flight"] == 0 and body["engine"]["kv_blocks_used"] == 0
        finally:
            runner.run(cm.__aexit__(None, None, None))
