"""BERT encoders in the engine: embeddings (mean and [CLS] pooling) and cross-encoder scores
of tiny random models equal transformers' (fp32), batched or one at a time."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.core.info import EngineInfo
from engine.models.model_kind import model_kind
from tests.support.tiny_bert import (
    make_tiny_bert_embedder,
    make_tiny_cross_encoder,
    reference_bert_embeddings,
    reference_cross_scores,
)

TEXTS = ["hello world", "paris is the capital city of france", "what is a yellow fruit?"]


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_bert_embeddings_equal_transformers(tmp_path, pooling):
    folder = make_tiny_bert_embedder(tmp_path / "bert", pooling)
    assert model_kind(folder).kind == "embed" and model_kind(folder).pooling == pooling
    llm = LLM(str(folder), device="cpu", dtype="float32")
    want = reference_bert_embeddings(folder, TEXTS, pooling)
    batched = llm.embed(TEXTS)
    alone = [llm.embed([t])[0] for t in TEXTS]
    for got_b, got_a, w in zip(batched, alone, want):
        torch.testing.assert_close(torch.tensor(got_b), w, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(got_a), w, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="does not generate text"):
        llm.generate(["hello"])
    info = EngineInfo.of(llm.engine)
    assert (info.kind, info.is_encoder, info.embedding_size) == ("embed", True, 64)


def test_cross_encoder_scores_equal_transformers(tmp_path):
    folder = make_tiny_cross_encoder(tmp_path / "cross")
    assert model_kind(folder).kind == "rerank"
    llm = LLM(str(folder), device="cpu", dtype="float32")
    docs = ["paris is the capital of france", "a banana is a yellow fruit", "hello"]
    want = reference_cross_scores(folder, "what is the capital of france?", docs)
    assert llm.score("what is the capital of france?", docs) == pytest.approx(want, abs=1e-5)
    info = EngineInfo.of(llm.engine)  # what the front end learns of it
    assert (info.kind, info.is_encoder, info.embedding_size) == ("rerank", True, None)
    assert len(set(round(s, 6) for s in want)) == 3  # the scores tell the documents apart


def test_encoder_prompts_run_whole_under_a_short_budget(tmp_path):
    """With a step budget shorter than the inputs together, each input still runs whole (one
    step), and one longer than the budget is refused, saying why."""
    folder = make_tiny_bert_embedder(tmp_path / "bert", "mean")
    llm = LLM(str(folder), device="cpu", dtype="float32", max_num_batched_tokens=16)
    want = reference_bert_embeddings(folder, TEXTS, "mean")
    for got, w in zip(llm.embed(TEXTS), want):
        torch.testing.assert_close(torch.tensor(got), w, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens=16"):
        llm.embed([" ".join(["paris"] * 20)])
