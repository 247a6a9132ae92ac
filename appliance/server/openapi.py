"""/openapi.json, generated: each route is listed once here with its summary and body models,
and every schema comes from those pydantic models (a test keeps the list equal to the router's).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from appliance.server.anthropic_api.schema import CountTokensRequest, MessagesRequest
from appliance.server.responses_api.schema import ResponsesRequest
from appliance.server.schema.base import RequestModel
from appliance.server.schema.pooling import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    RerankRequest,
    RerankResponse,
)
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
    ProbeResponse,
    TokenizeResponse,
)

REF = "#/components/schemas/{model}"
ABOUT = (
    "An OpenAI-compatible server for one model. In request bodies, null for a field means its "
    "default; fields marked (extension) are not in OpenAI's API. Every error is an "
    "ErrorResponse."
)


@dataclass(frozen=True)
class Route:
    summary: str
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    """The 200 body; None for a body that is not JSON or has no fixed schema."""
    media: str = "application/json"
    stream: type[BaseModel] | None = None
    """With "stream": true, the data of each Server-Sent Event."""
    params: tuple[str, ...] = ()


ROUTES: dict[tuple[str, str], Route] = {
    ("/v1/completions", "post"): Route(
        "Text completion (OpenAI)", CompletionRequest, CompletionResponse, stream=CompletionChunk
    ),
    ("/v1/chat/completions", "post"): Route(
        "Chat completion (OpenAI)",
        ChatCompletionRequest,
        ChatCompletionResponse,
        stream=ChatCompletionChunk,
    ),
    ("/v1/embeddings", "post"): Route(
        "Embeddings of texts or token ids (OpenAI); served by embedding models",
        EmbeddingsRequest,
        EmbeddingsResponse,
    ),
    ("/v1/rerank", "post"): Route(
        "Documents scored for relevance to a query (vLLM, Jina, Cohere); served by rerankers",
        RerankRequest,
        RerankResponse,
    ),
    ("/v1/responses", "post"): Route(
        'Create a response (OpenAI Responses API); with "stream": true, its Server-Sent Events '
        "(event: and data: lines, each data a JSON object with type and sequence_number)",
        ResponsesRequest,
    ),
    ("/v1/responses/{response_id}", "get"): Route(
        "A stored response of this API key", params=("response_id",)
    ),
    ("/v1/responses/{response_id}", "delete"): Route(
        "Delete a stored response of this API key", params=("response_id",)
    ),
    ("/v1/messages", "post"): Route(
        "A message (Anthropic's Messages API; errors in Anthropic's envelope)", MessagesRequest
    ),
    ("/v1/messages/count_tokens", "post"): Route(
        "The prompt's token count (Anthropic's Messages API)", CountTokensRequest
    ),
    ("/v1/models", "get"): Route(
        "The served models (with several: each one's status, kind and memory)",
        response=ModelList,
    ),
    ("/v1/models/{model}", "get"): Route(
        "One model by name", response=ModelCard, params=("model",)
    ),
    ("/v1/models/{model}/load", "post"): Route(
        "Load a model now (several models; an admin key where keys are set)",
        response=ModelCard,
        params=("model",),
    ),
    ("/v1/models/{model}/unload", "post"): Route(
        "Unload a model once its requests finish (several models; an admin key)",
        response=ModelCard,
        params=("model",),
    ),
    ("/health", "get"): Route(
        "200 when serving; 503 while loading, draining or failed", response=HealthResponse
    ),
    ("/health/live", "get"): Route(
        "Liveness: 200 while the process and its engine core run; 503 once the core is gone",
        response=ProbeResponse,
    ),
    ("/health/ready", "get"): Route(
        "Readiness: 200 when loaded, warmed up and not draining; 503 with the reason otherwise",
        response=ProbeResponse,
    ),
    ("/metrics", "get"): Route("Prometheus metrics (vLLM names)", media="text/plain"),
    ("/tokenize", "post"): Route(
        "Prompt or chat messages to token ids", TokenizeRequest, TokenizeResponse
    ),
    ("/detokenize", "post"): Route("Token ids to text", DetokenizeRequest, DetokenizeResponse),
    ("/v1/stats", "get"): Route("Engine, queue, KV, throughput, latency and recent traces"),
    ("/v1/stats/stream", "get"): Route(
        "/v1/stats as Server-Sent Events (~4/s)", media="text/event-stream"
    ),
    ("/v1/requests/{request_id}", "get"): Route(
        "One recent request's trace", params=("request_id",)
    ),
    ("/openapi.json", "get"): Route("This document"),
}
WEB_ROUTES: dict[tuple[str, str], Route] = {
    ("/", "get"): Route("The web page: chat and live dashboard", media="text/html"),
    ("/web/{path}", "get"): Route(
        "The web page's files (HTML, CSS, JavaScript modules)", media="text/plain", params=("path",)
    ),
    ("/v1/key", "get"): Route(
        "The API key this request carries: its name and whether it is an admin key (the web "
        "page shows usage by key to admin keys)"
    ),
}
"""The web page's routes (appliance.server.web_routes), listed only when it is served: off with
--no-web."""


class _Schema(GenerateJsonSchema):
    def field_title_should_be_set(self, schema) -> bool:
        return False  # "Top P" under top_p says nothing the name does not


def _ref(model: type[BaseModel]) -> dict:
    return {"$ref": REF.format(model=model.__name__)}


def _operation(route: Route) -> dict:
    schema = _ref(route.response) if route.response else {"type": "object"}
    if route.media != "application/json":
        schema = {"type": "string"}
    content = {route.media: {"schema": schema}}
    description = "OK"
    if route.stream is not None:
        content["text/event-stream"] = {"schema": _ref(route.stream)}
        description = (
            f'OK. With "stream": true, Server-Sent Events: each data line holds a '
            f"{route.stream.__name__}, and the last is [DONE]."
        )
    op: dict = {
        "summary": route.summary,
        "responses": {
            "200": {"description": description, "content": content},
            "default": {
                "description": "Error (OpenAI envelope)",
                "content": {"application/json": {"schema": _ref(ErrorResponse)}},
            },
        },
    }
    if route.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(route.body)}},
        }
    if route.params:
        op["parameters"] = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in route.params
        ]
    return op


@cache
def openapi_spec(web: bool = True) -> dict:
    """The OpenAPI 3.1 document (its schemas are JSON Schema 2020-12, as pydantic writes them);
    with `web`, the web page's routes too."""
    routes = {**ROUTES, **WEB_ROUTES} if web else ROUTES
    models = {ErrorResponse}
    for route in routes.values():
        models.update(m for m in (route.body, route.response, route.stream) if m is not None)
    keyed = [
        (m, "validation" if issubclass(m, RequestModel) else "serialization")
        for m in sorted(models, key=lambda m: m.__name__)
    ]
    _, defs = models_json_schema(keyed, ref_template=REF, schema_generator=_Schema)
    paths: dict = {}
    for (path, method), route in routes.items():
        paths.setdefault(path, {})[method] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "llm-appliance", "version": "0.1.0", "description": ABOUT},
        "components": {
            "schemas": defs["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
