"""The schema models against the running server: every body it sends fits its response model,
/openapi.json is generated from the request models, and its bounds are the ones the server
enforces."""

from __future__ import annotations

import json

import pytest

from appliance.server import openapi
from appliance.server.generation import Choice
from appliance.server.records import ChoiceRecord
from appliance.server.responses import Formatter
from appliance.server.schema.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from appliance.server.schema.responses import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionResponse,
    DetokenizeResponse,
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
)
from engine.sampling_params import SamplingParams
from engine.scheduling.request import RequestMetrics, RequestOutput
from tests.support.fake_engine import STALL_MARK
from tests.support.fake_server import fake_client, sse_events

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSGS = [{"role": "user", "content": "w5 w6"}]


async def test_every_body_fits_its_response_model():
    async with fake_client(stall_timeout=0.2) as client:
        for path, body, model, chunk in [
            (
                COMPLETIONS,
                {"prompt": ["w1", [4, 5]], "logprobs": 2, "stop": " w9"},
                CompletionResponse,
                CompletionChunk,
            ),
            (
                CHAT,
                {"messages": MSGS, "logprobs": True, "top_logprobs": 2},
                ChatCompletionResponse,
                ChatCompletionChunk,
            ),
        ]:
            body = {**body, "max_tokens": 4, "n": 2, "seed": 3}
            r = await client.post(path, json=body)
            assert r.status == 200
            model.model_validate(await r.json())
            stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
            events = sse_events(await (await client.post(path, json=stream)).text())
            assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] > 0
            for event in events:
                chunk.model_validate(event)
            plain = sse_events(
                await (await client.post(path, json={**body, "stream": True})).text()
            )
            for event in plain:
                assert "usage" not in event
                chunk.model_validate(event)
        ModelList.model_validate(await (await client.get("/v1/models")).json())
        ModelCard.model_validate(await (await client.get("/v1/models/fake-model")).json())
        HealthResponse.model_validate(await (await client.get("/health")).json())
        for body in ({"prompt": "w1 w2"}, {"messages": MSGS}):
            TokenizeResponse.model_validate(
                await (await client.post("/tokenize", json=body)).json()
            )
        r = await client.post("/detokenize", json={"tokens": [1, 2]})
        DetokenizeResponse.model_validate(await r.json())
        for r in (
            await client.post(COMPLETIONS, json={"prompt": "w1", "n": 0}),
            await client.get("/v1/models/other"),
            await client.get("/nowhere"),
        ):
            assert r.status >= 400
            ErrorResponse.model_validate(await r.json())
        stalled = {"prompt": f"w{STALL_MARK} w9", "max_tokens": 5, "stream": True}
        events = sse_events(await (await client.post(COMPLETIONS, json=stalled)).text())
        ErrorResponse.model_validate(events[-1])


def test_stream_chunks_carry_any_text_and_fit_the_models():
    text = ' 100% "quoted" \\ back\nslash, é 漢字 %s %d'
    for endpoint, model in (("chat", ChatCompletionChunk), ("completions", CompletionChunk)):
        fmt = Formatter(endpoint, "r%d", "m%s", 1, tokenizer=None)
        choice = Choice(ChoiceRecord(2, "e", 0, 3), [1], SamplingParams())
        sent = ""
        for end, finished in ((9, False), (len(text), False), (len(text), True)):
            choice.last = RequestOutput(
                "e",
                [1],
                [],
                text[:end],
                finished,
                "stop" if finished else None,
                RequestMetrics(arrival_time=0.0),
            )
            chunk = model.model_validate_json(fmt.delta_chunk(choice, with_usage=True))
            (item,) = chunk.choices
            assert chunk.id.endswith("-r%d") and chunk.model == "m%s" and item.index == 2
            sent += (item.delta.content or "") if endpoint == "chat" else item.text
            assert (item.finish_reason == "stop") == finished
        assert sent == text


# --- /openapi.json -------------------------------------------------------------------------
ANNOTATIONS = {"title", "description", "default"}
CHECKED = {
    "$ref",
    "anyOf",
    "type",
    "const",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "items",
    "properties",
    "required",
    "additionalProperties",
}
TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
    "integer": int,
    "number": (int, float),
}


def keywords(schema) -> set[str]:
    """Every JSON Schema keyword used under `schema` (property names are not keywords)."""
    if isinstance(schema, list):
        return set().union(*(keywords(s) for s in schema))
    if not isinstance(schema, dict):
        return set()
    found = set(schema)
    for key, value in schema.items():
        if key == "properties":
            found |= set().union(*(keywords(v) for v in value.values()))
        elif key not in ("default", "const", "enum"):
            found |= keywords(value)
    return found


def errors(value, schema: dict, spec: dict) -> list[str]:
    """Where `value` breaks `schema`, for the keywords in CHECKED (the spec uses no others)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return errors(value, spec["components"]["schemas"][name], spec)
    if "anyOf" in schema:
        branches = [errors(value, s, spec) for s in schema["anyOf"]]
        return [] if any(not b for b in branches) else ["no anyOf branch fits"]
    found = []
    kind = schema.get("type")
    is_bool = isinstance(value, bool)
    if kind and (not isinstance(value, TYPES[kind]) or (is_bool and kind in ("integer", "number"))):
        return [f"{value!r} is not {kind}"]
    if "const" in schema and value != schema["const"]:
        found.append(f"{value!r} != {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        found.append(f"{value} < {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        found.append(f"{value} > {schema['maximum']}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        found.append(f"{value} <= {schema['exclusiveMinimum']}")
    lo, hi = (
        schema.get("minLength", schema.get("minItems")),
        schema.get("maxLength", schema.get("maxItems")),
    )
    if lo is not None and len(value) < lo or hi is not None and len(value) > hi:
        found.append(f"length {len(value)} outside [{lo}, {hi}]")
    for item in value if kind == "array" else []:
        found += errors(item, schema.get("items", {}), spec)
    if kind == "object":
        props = schema.get("properties", {})
        found += [f"{k} is missing" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            if k in props:
                found += [f"{k}: {e}" for e in errors(v, props[k], spec)]
            elif schema.get("additionalProperties") is False:
                found.append(f"{k} is not allowed")
    return found


FULL_COMPLETION = {
    "model": "fake-model",
    "prompt": ["w1 w2", [5, 6]],
    "max_tokens": 3,
    "n": 2,
    "best_of": 2,
    "stream": False,
    "stream_options": {"include_usage": True},
    "stop": [" w9"],
    "stop_token_ids": [0],
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "seed": 9,
    "ignore_eos": True,
    "skip_special_tokens": False,
    "logprobs": 3,
    "echo": False,
    "suffix": "",
    "logit_bias": {},
    "user": "u",
    "metadata": {"k": "v"},
    "store": False,
    "service_tier": "auto",
    "parallel_tool_calls": True,
    "response_format": {"type": "text"},  # "text" constrains nothing; the others: at most one
    "regex": None,
    "choice": None,
    "grammar": None,
    "cache_salt": "team-a",
}
COMPLETION_ONLY = ("prompt", "echo", "suffix", "best_of")
FULL_CHAT = {
    **{k: v for k, v in FULL_COMPLETION.items() if k not in COMPLETION_ONLY},
    "messages": [
        {"role": "developer", "content": "w1"},
        {"role": "user", "name": "x", "content": [{"type": "text", "text": "w2"}]},
    ],
    "max_completion_tokens": 3,
    "logprobs": True,
    "top_logprobs": 2,
    "tools": [],
    "tool_choice": "auto",
    "chat_template_kwargs": {"enable_thinking": False},
    "modalities": ["text"],
    "functions": [],
    "function_call": "none",
}


async def test_openapi_is_the_request_models_and_an_example_fits_both():
    async with fake_client() as client:
        spec = await (await client.get("/openapi.json")).json()
        schemas = spec["components"]["schemas"]
        used = keywords(list(schemas.values()))
        assert used <= CHECKED | ANNOTATIONS, used - CHECKED - ANNOTATIONS
        for model in (CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest):
            assert set(schemas[model.__name__]["properties"]) == set(model.model_fields)
        for name in ("top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids"):
            assert "(extension)" in schemas["CompletionRequest"]["properties"][name]["description"]
        for path, body in ((COMPLETIONS, FULL_COMPLETION), (CHAT, FULL_CHAT)):
            model = CompletionRequest if path == COMPLETIONS else ChatCompletionRequest
            assert set(body) == set(model.model_fields)  # the example sets every field
            op = spec["paths"][path]["post"]
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            assert errors(body, schema, spec) == []
            # temperature is nullable (omitted = the model's default): its number branch refuses
            assert errors({**body, "temperature": 2.5}, schema, spec) == [
                "temperature: no anyOf branch fits"
            ]
            assert errors({**body, "temperature": None}, schema, spec) == []
            assert errors({**body, "presence_penalty": 2.5}, schema, spec) == [
                "presence_penalty: 2.5 > 2.0"
            ]
            assert errors({**body, "nope": 1}, schema, spec) == ["nope is not allowed"]
            r = await client.post(path, json=body)
            assert r.status == 200, await r.text()
            answer = op["responses"]["200"]["content"]["application/json"]["schema"]
            assert errors(await r.json(), answer, spec) == []


def test_a_field_added_to_a_model_appears_in_openapi(monkeypatch):
    class Wider(CompletionRequest):
        brand_new: int = 3

    route = openapi.ROUTES[(COMPLETIONS, "post")]
    monkeypatch.setitem(
        openapi.ROUTES,
        (COMPLETIONS, "post"),
        route.__class__(route.summary, Wider, route.response, stream=route.stream),
    )
    spec = openapi.openapi_spec.__wrapped__()
    ref = spec["paths"][COMPLETIONS]["post"]["requestBody"]["content"]["application/json"]
    assert ref["schema"]["$ref"].endswith("/Wider")
    assert spec["components"]["schemas"]["Wider"]["properties"]["brand_new"]["default"] == 3


def bounds(spec: dict, model: str) -> list[tuple[str, object, object]]:
    """(field, a value at its bound, a value past it) for each numeric bound in the spec."""
    out = []
    for name, prop in spec["components"]["schemas"][model]["properties"].items():
        for s in prop.get("anyOf", [prop]):
            step = 1 if s.get("type") == "integer" else 0.01
            if "minimum" in s:
                out.append((name, s["minimum"], s["minimum"] - step))
            if "exclusiveMinimum" in s:
                out.append((name, s["exclusiveMinimum"] + step, s["exclusiveMinimum"]))
            if "maximum" in s:
                out.append((name, s["maximum"], s["maximum"] + step))
    return out


@pytest.mark.parametrize(
    "path,model", [(COMPLETIONS, "CompletionRequest"), (CHAT, "ChatCompletionRequest")]
)
async def test_the_servers_bounds_are_the_documented_ones(path, model):
    async with fake_client(max_n=128) as client:
        spec = await (await client.get("/openapi.json")).json()
        cases = bounds(spec, model)
        assert {"temperature", "top_p", "top_k", "n", "seed", "max_tokens"} <= {c[0] for c in cases}
        base = {"prompt": "w1"} if path == COMPLETIONS else {"messages": MSGS, "logprobs": True}
        for name, ok, bad in cases:
            body = {**base, "max_tokens": 1, name: ok}
            if name == "best_of":
                body["n"] = ok
            r = await client.post(path, json=body)
            assert r.status == 200, (name, ok, await r.text())
            r = await client.post(path, json={**body, name: bad})
            err = (await r.json())["error"]
            assert r.status == 400 and err["param"] == name, (name, bad, err)
            assert f"'{name}' must be" in err["message"] and json.dumps(bad) in err["message"]
