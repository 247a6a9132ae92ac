"""Tiny random-weight embedding and reranking models (Qwen3 family), saved as their real
counterparts are: a sentence-transformers folder with last-token pooling, and a causal LM
named *reranker* whose tokenizer has single "yes" and "no" tokens."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from tests.support.tiny_models import make_tiny_model

LAST_TOKEN_POOLING = {
    "word_embedding_dimension": 64,
    "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": False,
    "pooling_mode_lasttoken": True,
}


def make_tiny_embedder(folder: Path) -> Path:
    """A Qwen3 embedding model as Qwen3-Embedding ships: modules.json + 1_Pooling."""
    make_tiny_model("qwen3", folder)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(LAST_TOKEN_POOLING))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def make_tiny_reranker(folder: Path) -> Path:
    """A Qwen3 causal LM in a folder named like Qwen3-Reranker, "yes" and "no" added to the
    tokenizer (ids inside the model's vocabulary)."""
    make_tiny_model("qwen3", folder, seed=1)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_tokens(["yes", "no"])
    tok.save_pretrained(folder)
    return folder


def reference_embeddings(folder: Path, token_ids: list[list[int]]) -> list[torch.Tensor]:
    """transformers' hidden states, last-token pooled and L2-normalised (fp32)."""
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in token_ids:
            hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
            out.append(torch.nn.functional.normalize(hidden, dim=-1))
    return out


def reference_scores(folder: Path, token_ids: list[list[int]]) -> list[float]:
    """transformers' P(yes) against P(no) at each prompt's last token."""
    tok = AutoTokenizer.from_pretrained(folder)
    no, yes = tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    scores = []
    with torch.no_grad():
        for ids in token_ids:
            logits = model(torch.tensor([ids])).logits[0, -1]
            scores.append(torch.softmax(logits[[no, yes]], dim=-1)[1].item())
    return scores
