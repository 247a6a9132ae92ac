"""Pooling on the GPU (Triton kernels, CUDA graphs, overlapped steps): embeddings and scores of
tiny Qwen3 and BERT models equal transformers' (fp32), with generation running beside them."""

from __future__ import annotations

import gc

import pytest
import torch

from engine import LLM
from tests.support.tiny_bert import (
    make_tiny_bert_embedder,
    make_tiny_cross_encoder,
    reference_bert_embeddings,
    reference_cross_scores,
)
from tests.support.tiny_embed import (
    make_tiny_embedder,
    make_tiny_reranker,
    reference_embeddings,
    reference_scores,
)

pytestmark = pytest.mark.gpu
TEXTS = ["hello world", "paris is the capital city of france", "x", "what is a yellow fruit?"]


SMALL = {"max_num_seqs": 8}


def release(llm) -> None:
    """Free an engine's device memory before the next one plans and checks its own."""
    del llm.engine
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("eager", [True, False])
def test_gpu_decoder_embeddings_and_scores(tmp_path, eager):
    folder = make_tiny_embedder(tmp_path / "tiny-qwen3-embedding")
    llm = LLM(str(folder), device="cuda", dtype="float32", enforce_eager=eager, **SMALL)
    want = reference_embeddings(folder, [llm.engine.encode(t) for t in TEXTS])
    for got, w in zip(llm.embed(TEXTS), want):
        torch.testing.assert_close(torch.tensor(got), w, atol=1e-4, rtol=0)
    release(llm)
    folder = make_tiny_reranker(tmp_path / "tiny-qwen3-reranker")
    llm = LLM(str(folder), device="cuda", dtype="float32", enforce_eager=eager, **SMALL)
    scores = llm.score("capital of france?", TEXTS)
    from engine.text.rerank_prompt import rerank_prompt

    ids = [llm.engine.encode(rerank_prompt("capital of france?", t)) for t in TEXTS]
    assert scores == pytest.approx(reference_scores(folder, ids), abs=1e-4)


def test_gpu_bert(tmp_path):
    folder = make_tiny_bert_embedder(tmp_path / "bert", "mean")
    llm = LLM(str(folder), device="cuda", dtype="float32", **SMALL)
    for got, w in zip(llm.embed(TEXTS), reference_bert_embeddings(folder, TEXTS, "mean")):
        torch.testing.assert_close(torch.tensor(got), w, atol=1e-4, rtol=0)
    release(llm)
    folder = make_tiny_cross_encoder(tmp_path / "cross")
    llm = LLM(str(folder), device="cuda", dtype="float32", **SMALL)
    want = reference_cross_scores(folder, "capital of france?", TEXTS)
    assert llm.score("capital of france?", TEXTS) == pytest.approx(want, abs=1e-4)
