"""The bodies of /v1/embeddings (OpenAI's) and /v1/rerank (vLLM's, Jina's, Cohere's): parsed
into plain values with a 400 naming the field for every bad input, and the vectors shaped into
the answer (float lists or base64, Matryoshka `dimensions`)."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass

import numpy as np

from appliance.server.errors import bad_request

ENCODING_FORMATS = ("float", "base64")
"""/v1/embeddings' encoding_format values."""


@dataclass
class EmbeddingsBody:
    model: str | None
    inputs: list[str | list[int]]
    """Each input: text, or token ids."""
    encoding_format: str
    dimensions: int | None


@dataclass
class RerankBody:
    model: str | None
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    instruction: str | None


def _model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    return model


def _is_ids(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def parse_embeddings(body: dict) -> EmbeddingsBody:
    data = body.get("input")
    if isinstance(data, str) or (_is_ids(data) and data):
        inputs = [data]
    elif isinstance(data, list) and data and all(isinstance(x, str) or _is_ids(x) for x in data):
        inputs = list(data)
    else:
        raise bad_request(
            "input must be a non-empty string, a list of strings, a list of token ids or a list "
            "of lists of token ids",
            "input",
        )
    if any(not x for x in inputs):
        raise bad_request("every input must be non-empty", "input")
    fmt = body.get("encoding_format", "float") or "float"
    if fmt not in ENCODING_FORMATS:
        raise bad_request(
            f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}", "encoding_format"
        )
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise bad_request("dimensions must be a positive integer", "dimensions")
    return EmbeddingsBody(_model(body), inputs, fmt, dims)


def parse_rerank(body: dict) -> RerankBody:
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise bad_request("query must be a non-empty string", "query")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise bad_request("documents must be a non-empty list", "documents")
    texts = []
    for i, doc in enumerate(docs):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str) or not text:
            raise bad_request(
                f"documents[{i}] must be a non-empty string or an object with a text field",
                "documents",
            )
        texts.append(text)
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        raise bad_request("top_n must be a positive integer", "top_n")
    return_documents = body.get("return_documents", True)
    if not isinstance(return_documents, bool):
        raise bad_request("return_documents must be true or false", "return_documents")
    instruction = body.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise bad_request("instruction must be a string", "instruction")
    return RerankBody(_model(body), query, texts, top_n, return_documents, instruction)


def check_dimensions(dimensions: int | None, size: int) -> None:
    """A 400 when the request asks for more dimensions than the model's vectors have."""
    if dimensions is not None and dimensions > size:
        raise bad_request(
            f"dimensions is {dimensions} but this model's embeddings have {size}; ask for at "
            f"most {size}",
            "dimensions",
        )


def shape_embedding(vector: list[float], dimensions: int | None, fmt: str) -> list[float] | str:
    """Truncate to `dimensions` and renormalise (Matryoshka), then encode: a float list, or
    base64 of little-endian float32 bytes."""
    if dimensions is not None and dimensions < len(vector):
        vector = vector[:dimensions]
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        vector = [x / norm for x in vector]
    if fmt == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector
