"""/v1/embeddings and /v1/rerank on a real `appliance serve` of tiny Qwen3 models: the openai
client's embeddings.create, base64 and `dimensions`, rerank order and scores, and a 400 in
OpenAI's envelope for every bad input or wrong kind of model."""

from __future__ import annotations

import base64
import json
import math
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

from engine.text.rerank_prompt import rerank_prompt
from tests.support.serve_process import start_server, stop_server
from tests.support.shared_server import KEYS
from tests.support.tiny_embed import (
    make_tiny_embedder,
    make_tiny_reranker,
    reference_embeddings,
    reference_scores,
)
from tests.support.tiny_models import byte_tokenizer

openai = pytest.importorskip("openai")
FLAGS = ("--dtype", "float32", "--log-level", "warning")


def _serve(folder, max_model_len: int):
    """The byte-level tokenizer spends a token per byte: the reranker's template needs 512."""
    return start_server("--model", str(folder), "--max-model-len", str(max_model_len), *FLAGS)


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    folder = make_tiny_embedder(tmp_path_factory.mktemp("tiny-qwen3-embedding"))
    proc, url = _serve(folder, 256)
    yield folder, url
    stop_server(proc)


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory):
    folder = make_tiny_reranker(tmp_path_factory.mktemp("m") / "tiny-qwen3-reranker")
    proc, url = _serve(folder, 512)
    yield folder, url
    stop_server(proc)


def post(url: str, path: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_openai_client_embeddings_equal_transformers(embed_server):
    folder, url = embed_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    texts = ["hello world", "a second, longer input to embed"]
    got = client.embeddings.create(model=client.models.list().data[0].id, input=texts)
    ids = [byte_tokenizer().encode(t) for t in texts]
    want = reference_embeddings(folder, ids)
    assert [d.index for d in got.data] == [0, 1]
    for d, w in zip(got.data, want):
        torch.testing.assert_close(torch.tensor(d.embedding), w, atol=1e-5, rtol=0)
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(map(len, ids))
    # token ids in: the same vectors
    by_ids = client.embeddings.create(model=got.model, input=ids)
    assert [d.embedding for d in by_ids.data] == [d.embedding for d in got.data]


def test_base64_and_dimensions(embed_server):
    _, url = embed_server
    status, plain = post(url, "/v1/embeddings", {"input": "hello"})
    assert status == 200 and plain["object"] == "list"
    vector = plain["data"][0]["embedding"]
    status, b64 = post(url, "/v1/embeddings", {"input": "hello", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == pytest.approx(vector, abs=1e-7)
    status, cut = post(url, "/v1/embeddings", {"input": "hello", "dimensions": 16})
    short = cut["data"][0]["embedding"]
    norm = math.sqrt(sum(x * x for x in vector[:16]))
    assert len(short) == 16 and short == pytest.approx([x / norm for x in vector[:16]], abs=1e-6)
    assert math.isclose(sum(x * x for x in short), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": [""]}, "input"),
        ({"input": [1.5]}, "input"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 65}, "dimensions"),
        ({"input": [[1, 2], [99999]]}, None),
        ({"input": "x" * 400}, None),
    ],
)
def test_bad_embedding_inputs_are_400(embed_server, body, param):
    status, answer = post(embed_server[1], "/v1/embeddings", body)
    assert status == 400, answer
    assert answer["error"]["message"] and answer["error"]["param"] == param


def test_wrong_kind_of_model_is_400(embed_server, shared_server):
    status, answer = post(
        embed_server[1], "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 400 and "/v1/embeddings" in answer["error"]["message"]
    status, answer = post(shared_server.url, "/v1/embeddings", {"input": "hi"}, KEYS["alice"])
    assert status == 400 and "generates text" in answer["error"]["message"]
    status, answer = post(embed_server[1], "/v1/rerank", {"query": "q", "documents": ["d"]})
    assert status == 400 and "/v1/embeddings" in answer["error"]["message"]


def test_rerank_scores_and_order(rerank_server):
    folder, url = rerank_server
    docs = ["paris is the capital of france", "bananas", {"text": "france, capital: paris"}]
    status, answer = post(url, "/v1/rerank", {"query": "capital of france?", "documents": docs})
    assert status == 200, answer
    texts = [d if isinstance(d, str) else d["text"] for d in docs]
    tok = byte_tokenizer()
    tok.add_tokens(["yes", "no"])
    want = reference_scores(
        folder, [tok.encode(rerank_prompt("capital of france?", t)) for t in texts]
    )
    results = answer["results"]
    assert [r["index"] for r in results] == sorted(range(3), key=lambda i: -want[i])
    for r in results:
        assert r["relevance_score"] == pytest.approx(want[r["index"]], abs=1e-5)
        assert r["document"]["text"] == texts[r["index"]]
    assert answer["usage"]["total_tokens"] > 0
    status, top = post(
        url,
        "/v1/rerank",
        {"query": "capital of france?", "documents": docs, "top_n": 1, "return_documents": False},
    )
    assert [r["index"] for r in top["results"]] == [results[0]["index"]]
    assert "document" not in top["results"][0]
    for bad in (
        {"documents": ["d"]},
        {"query": "q", "documents": []},
        {"query": "q", "documents": [3]},
    ):
        status, answer = post(url, "/v1/rerank", bad)
        assert status == 400 and answer["error"]["message"]


def test_stats_and_metrics_count_pooling_requests(embed_server):
    _, url = embed_server
    assert post(url, "/v1/embeddings", {"input": ["one", "two"]})[0] == 200
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(url + "/v1/stats", timeout=30) as resp:
        assert resp.status == 200 and json.loads(resp.read())
