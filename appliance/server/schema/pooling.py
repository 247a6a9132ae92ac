"""The bodies of /v1/embeddings and /v1/rerank, for /openapi.json (the routes parse them in
appliance/server/pooling_inputs.py, which owns their checks)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class EmbeddingsRequest(BaseModel):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="Text, texts, token ids, or lists of token ids; one embedding each."
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(
        None, description="Keep the first dimensions values and renormalise (Matryoshka)."
    )


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="Floats, or base64 of little-endian float32.")


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class RerankDocument(BaseModel):
    text: str


class RerankRequest(BaseModel):
    model: str | None = None
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(None, description="Return only the best top_n results.")
    return_documents: bool = True
    instruction: str | None = Field(
        None, description="(extension) The reranker's task instruction."
    )


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult] = Field(description="Ordered by relevance_score, best first.")
    usage: RerankUsage
