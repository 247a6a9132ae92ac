"""The OpenAPI 3 description of every route (a test keeps it equal to the router's table)."""

from __future__ import annotations

from functools import cache

_NUM = {"type": "number"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STR = {"type": "string"}
_STOP = {"oneOf": [_STR, {"type": "array", "items": _STR, "maxItems": 16}]}

_SAMPLING = {
    "model": _STR,
    "max_tokens": {**_INT, "minimum": 1},
    "temperature": {**_NUM, "minimum": 0, "maximum": 2},
    "top_p": {**_NUM, "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {**_INT, "minimum": -1},
    "min_p": {**_NUM, "minimum": 0, "maximum": 1},
    "n": {**_INT, "minimum": 1, "maximum": 128},
    "stream": _BOOL,
    "stream_options": {"type": "object", "properties": {"include_usage": _BOOL}},
    "stop": _STOP,
    "stop_token_ids": {"type": "array", "items": {**_INT, "minimum": 0}},
    "presence_penalty": {**_NUM, "minimum": -2, "maximum": 2},
    "frequency_penalty": {**_NUM, "minimum": -2, "maximum": 2},
    "repetition_penalty": {**_NUM, "exclusiveMinimum": 0, "maximum": 2},
    "seed": {**_INT, "minimum": 0},
    "ignore_eos": _BOOL,
    "skip_special_tokens": _BOOL,
    "user": _STR,
}
_MESSAGES = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {
                "oneOf": [
                    _STR,
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["type", "text"],
                            "properties": {"type": {"enum": ["text"]}, "text": _STR},
                        },
                    },
                ]
            },
            "name": _STR,
        },
    },
}
_PROMPT = {
    "oneOf": [
        {**_STR, "minLength": 1},
        {"type": "array", "items": {**_INT, "minimum": 0}, "minItems": 1},
        {"type": "array", "items": {**_STR, "minLength": 1}, "minItems": 1},
    ]
}
_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"message": _STR, "type": _STR, "param": {}, "code": {}},
        }
    },
}


def _body(props: dict, required: list[str]) -> dict:
    return {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"type": "object", "properties": props, "required": required}
            }
        },
    }


def _op(summary: str, body: dict | None = None, stream: bool = False, params=()) -> dict:
    content = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": _STR}
    op: dict = {
        "summary": summary,
        "responses": {
            "200": {"description": "OK", "content": content},
            "default": {
                "description": "Error (OpenAI envelope)",
                "content": {"application/json": {"schema": _ERROR}},
            },
        },
    }
    if body is not None:
        op["requestBody"] = body
    if params:
        op["parameters"] = [
            {"name": p, "in": "path", "required": True, "schema": _STR} for p in params
        ]
    return op


@cache
def openapi_spec() -> dict:
    completion = {
        **_SAMPLING,
        "prompt": _PROMPT,
        "logprobs": {**_INT, "minimum": 0, "maximum": 20},
        "echo": _BOOL,
        "best_of": {**_INT, "minimum": 1},
    }
    chat = {
        **_SAMPLING,
        "messages": _MESSAGES,
        "max_completion_tokens": {**_INT, "minimum": 1},
        "logprobs": _BOOL,
        "top_logprobs": {**_INT, "minimum": 0, "maximum": 20},
    }
    tokenize = {"model": _STR, "prompt": _STR, "messages": _MESSAGES, "add_special_tokens": _BOOL}
    detokenize = {"model": _STR, "tokens": {"type": "array", "items": {**_INT, "minimum": 0}}}
    paths = {
        "/v1/completions": {
            "post": _op("Text completion (OpenAI)", _body(completion, ["prompt"]), stream=True)
        },
        "/v1/chat/completions": {
            "post": _op("Chat completion (OpenAI)", _body(chat, ["messages"]), stream=True)
        },
        "/v1/models": {"get": _op("The served model")},
        "/v1/models/{model}": {"get": _op("One model by name", params=["model"])},
        "/health": {"get": _op("200 when serving; 503 while loading, draining or failed")},
        "/metrics": {"get": _op("Prometheus metrics (vLLM names)")},
        "/tokenize": {"post": _op("Prompt or chat messages to token ids", _body(tokenize, []))},
        "/detokenize": {"post": _op("Token ids to text", _body(detokenize, ["tokens"]))},
        "/v1/stats": {"get": _op("Engine, queue, KV, throughput, latency and recent traces")},
        "/v1/stats/stream": {"get": _op("/v1/stats as Server-Sent Events (~4/s)", stream=True)},
        "/v1/requests/{request_id}": {
            "get": _op("One recent request's trace", params=["request_id"])
        },
        "/openapi.json": {"get": _op("This document")},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "llm-appliance", "version": "0.1.0"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
