"""Pooler: what a pooling request (SamplingParams.pooling) gets instead of a sampled token.

"embed": the final hidden states (the model's final norm applied) pooled by the model's rule,
L2-normalised. Decoders (Qwen3-Embedding) pool the last token: their prompts may run in
chunks, and the last chunk holds it. Encoders (BERT) run prompts whole and may pool the mean
of every token or the first ([CLS]) one.
"score": a cross-encoder's classifier on its [CLS] state (sigmoid of a single label's logit),
or a Qwen3-Reranker's probability of "yes" against "no" at the last token:
softmax([logit(no), logit(yes)])[1]."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.text.rerank_prompt import score_token_ids


@dataclass(frozen=True)
class Pooler:
    mode: str = "lasttoken"
    """The embedding rule, one of engine.models.model_kind.POOLING_MODES."""
    score_token_ids: tuple[int, int] | None = None
    """(no, yes) token ids of a decoder reranker."""
    classifies: bool = False
    """The model is a cross-encoder: it scores by its classifier (model.classify)."""

    @property
    def can_score(self) -> bool:
        return self.classifies or self.score_token_ids is not None

    @torch.inference_mode()
    def pool(
        self, model, hidden: torch.Tensor, spans: list[tuple[int, int]], tasks: list[str]
    ) -> list[list[float]]:
        """hidden: [num_tokens, hidden], the step's states; spans: each pooling request's rows
        [start, end) in it (its last chunk), with its task. One vector per request, read back
        to the host."""
        out: list[list[float] | None] = [None] * len(tasks)
        embed = [i for i, t in enumerate(tasks) if t == "embed"]
        score = [i for i, t in enumerate(tasks) if t == "score"]
        if embed:
            vectors = F.normalize(self._embed(hidden, [spans[i] for i in embed]), dim=-1)
            for i, v in zip(embed, vectors.tolist()):
                out[i] = v
        if score:
            for i, p in zip(score, self._score(model, hidden, [spans[i] for i in score])):
                out[i] = [p]
        return out

    def _embed(self, hidden: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
        if self.mode == "mean":
            return torch.stack([hidden[s:e].float().mean(0) for s, e in spans])
        rows = [s if self.mode == "cls" else e - 1 for s, e in spans]
        return hidden[rows].float()  # [num_embed, hidden]

    def _score(self, model, hidden: torch.Tensor, spans: list[tuple[int, int]]) -> list[float]:
        if self.classifies:
            logits = model.classify(hidden[[s for s, _ in spans]]).float()  # [n, num_labels]
            if logits.shape[-1] == 1:
                return torch.sigmoid(logits[:, 0]).tolist()
            return torch.softmax(logits, dim=-1)[:, -1].tolist()
        if self.score_token_ids is None:
            raise ValueError("this model is not a reranker: it cannot score")
        logits = model.compute_logits(hidden[[e - 1 for _, e in spans]])
        logits = logits[:, list(self.score_token_ids)].float()  # [n, 2]: no, yes
        return torch.softmax(logits, dim=-1)[:, 1].tolist()


def pooler_for(kind, model, tokenizer) -> Pooler:
    """The pooler of a model of `kind` (engine.models.model_kind.ModelKind); an encoder's model
    learns its [SEP] id here (its token types follow it)."""
    is_encoder = getattr(model, "classify", None) is not None
    if is_encoder:
        model.sep_token_id = getattr(tokenizer, "sep_token_id", None)
    if kind.kind == "embed":
        return Pooler(kind.pooling)
    if kind.kind == "rerank" and is_encoder:
        return Pooler(classifies=True)
    if kind.kind == "rerank":
        return Pooler(score_token_ids=score_token_ids(tokenizer))
    return Pooler()
