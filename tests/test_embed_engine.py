"""Pooling requests in the engine: embeddings and reranker scores of tiny Qwen3 models equal
transformers' own computation (fp32), batched or alone, with the prefix cache on."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.model_kind import model_kind
from tests.support.tiny_embed import (
    make_tiny_embedder,
    make_tiny_reranker,
    reference_embeddings,
    reference_scores,
)

TEXTS = ["hello world", "a longer sentence about embeddings, pooled at its last token", "x"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    folder = make_tiny_embedder(tmp_path_factory.mktemp("tiny-qwen3-embedding"))
    return folder, LLM(str(folder), device="cpu", dtype="float32", block_size=16)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    folder = make_tiny_reranker(tmp_path_factory.mktemp("m") / "tiny-qwen3-reranker")
    return folder, LLM(str(folder), device="cpu", dtype="float32")


def test_model_kinds(embedder, reranker, tiny_llama):
    assert model_kind(embedder[0]).kind == "embed"
    assert model_kind(embedder[0]).pooling == "lasttoken"
    assert model_kind(reranker[0]).kind == "rerank"
    assert model_kind(tiny_llama).kind == "generate"


def test_embeddings_equal_transformers_batched_and_alone(embedder):
    folder, llm = embedder
    token_ids = [llm.engine.encode(t) for t in TEXTS]
    ref = reference_embeddings(folder, token_ids)
    batched = llm.embed(TEXTS)
    alone = [llm.embed([t])[0] for t in TEXTS]
    for got_b, got_a, want in zip(batched, alone, ref):
        assert len(got_b) == want.numel()
        torch.testing.assert_close(torch.tensor(got_b), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(got_a), want, atol=1e-5, rtol=0)
    assert llm.embed([token_ids[0]]) == [batched[0]]  # token ids in, the same vector out


def test_prefix_cache_hit_gives_the_same_embedding(embedder):
    folder, llm = embedder
    long = "the same long prefix, shared by both requests so that a block is cached " * 2
    first = llm.embed([long + "one"])[0]
    outs = llm.generate([long + "two"], SamplingParams(max_tokens=1, pooling="embed"))
    assert outs[0].num_cached_tokens > 0
    ref = reference_embeddings(folder, [llm.engine.encode(long + t) for t in ("one", "two")])
    torch.testing.assert_close(torch.tensor(first), ref[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(outs[0].pooled), ref[1], atol=1e-5, rtol=0)


def test_rerank_scores_equal_transformers(reranker):
    folder, llm = reranker
    docs = ["paris is the capital of france", "bananas are yellow", "france"]
    scores = llm.score("capital of france?", docs)
    from engine.text.rerank_prompt import rerank_prompt

    prompts = [llm.engine.encode(rerank_prompt("capital of france?", d)) for d in docs]
    want = reference_scores(folder, prompts)
    assert scores == pytest.approx(want, abs=1e-5)
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_wrong_task_is_refused(embedder, reranker):
    with pytest.raises(ValueError, match="does not generate text"):
        embedder[1].generate(["hi"])
    with pytest.raises(ValueError, match="not a reranker"):
        embedder[1].score("q", ["d"])
    with pytest.raises(ValueError, match="not an embedding model"):
        reranker[1].embed(["hi"])


def test_a_headless_qwen3_model_embeds(tmp_path):
    """A checkpoint saved as Qwen3Model (no LM head, no "model." prefix, no 1_Pooling) is an
    embedding model pooled by its last token."""
    from transformers import AutoModel

    from tests.support.tiny_models import byte_tokenizer, tiny_config

    torch.manual_seed(3)
    AutoModel.from_config(tiny_config("qwen3")).save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    assert model_kind(tmp_path).kind == "embed"
    llm = LLM(str(tmp_path), device="cpu", dtype="float32")
    want = reference_embeddings(tmp_path, [llm.engine.encode(t) for t in TEXTS])
    for got, w in zip(llm.embed(TEXTS), want):
        torch.testing.assert_close(torch.tensor(got), w, atol=1e-5, rtol=0)


def test_a_prompt_prefilled_in_chunks_pools_its_last_token(embedder):
    folder, _ = embedder
    llm = LLM(str(folder), device="cpu", dtype="float32", max_num_batched_tokens=16)
    text = "a prompt much longer than one step's budget of sixteen tokens, run in chunks"
    got = llm.generate([text], SamplingParams(max_tokens=1, pooling="embed"))[0]
    assert got.metrics.num_prefill_chunks > 1
    want = reference_embeddings(folder, [llm.engine.encode(text)])[0]
    torch.testing.assert_close(torch.tensor(got.pooled), want, atol=1e-5, rtol=0)


def test_task_names_a_reranker_its_folder_does_not(tmp_path, reranker, tiny_llama):
    """A Qwen3-Reranker saved under another name reads as a text model; task="rerank" serves
    it as the reranker it is, with the same scores."""
    folder = make_tiny_reranker(tmp_path / "tiny-qwen3-scorer")
    assert model_kind(folder).kind == "generate"
    assert model_kind(folder, is_encoder=False, task="rerank").kind == "rerank"
    assert model_kind(tiny_llama, is_encoder=False, task="embed").pooling == "lasttoken"
    llm = LLM(str(folder), device="cpu", dtype="float32", task="rerank")
    docs = ["paris is the capital of france", "bananas are yellow"]
    assert llm.score("capital of france?", docs) == pytest.approx(
        reranker[1].score("capital of france?", docs), abs=1e-6
    )
    with pytest.raises(ValueError, match="task must be one of"):
        model_kind(folder, task="classify")
