"""Tiny random-weight BERT models with a small WordPiece tokenizer: an embedding model
(sentence-transformers folder, mean or [CLS] pooling) and a cross-encoder
(BertForSequenceClassification, one label), plus transformers' reference computations."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
)

WORDS = "the a of to and is in it capital city france paris banana yellow fruit what hello world"
VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    *WORDS.split(),
    *"abcdefghijklmnopqrstuvwxyz",
]
VOCAB += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list(",.?!")


def _config(**extra) -> BertConfig:
    return BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        **extra,
    )


def _save(model, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():  # larger than the default init: outputs that differ across inputs
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(VOCAB)}).save_pretrained(folder)
    return folder


def make_tiny_bert_embedder(folder: Path, pooling: str = "mean") -> Path:
    """pooling: "mean" or "cls", as 1_Pooling/config.json says."""
    torch.manual_seed(0)
    _save(BertModel(_config()), folder)
    (folder / "1_Pooling").mkdir()
    mode = {
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_cls_token": pooling == "cls",
    }
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(mode))
    (folder / "modules.json").write_text("[]")
    return folder


def make_tiny_cross_encoder(folder: Path) -> Path:
    torch.manual_seed(1)
    return _save(BertForSequenceClassification(_config(num_labels=1)), folder)


def reference_bert_embeddings(folder: Path, texts: list[str], pooling: str) -> list[torch.Tensor]:
    tok = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            hidden = model(**tok(text, return_tensors="pt")).last_hidden_state[0]
            pooled = hidden.mean(0) if pooling == "mean" else hidden[0]
            out.append(F.normalize(pooled, dim=-1))
    return out


def reference_cross_scores(folder: Path, query: str, docs: list[str]) -> list[float]:
    tok = AutoTokenizer.from_pretrained(folder)
    model = BertForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return [
            torch.sigmoid(model(**tok(query, d, return_tensors="pt")).logits[0, 0]).item()
            for d in docs
        ]
