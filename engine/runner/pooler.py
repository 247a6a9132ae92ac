"""Pooler: what a pooling request (SamplingParams.pooling) gets instead of a sampled token.

"embed": the hidden state at the prompt's last token (the model's final norm applied),
L2-normalised: last-token pooling, as decoder embedding models (Qwen3-Embedding) are trained.
"score": a Qwen3-Reranker's relevance, the probability of "yes" against "no" at the last
token: softmax([logit(no), logit(yes)])[1]."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Pooler:
    score_token_ids: tuple[int, int] | None = None
    """(no, yes) token ids of a reranker; None: the model cannot score."""

    @torch.inference_mode()
    def pool(self, model, hidden: torch.Tensor, tasks: list[str]) -> list[list[float]]:
        """hidden: [num_requests, hidden] last-token states, one row per task; returns one
        vector per row (read back to the host)."""
        out: list[list[float] | None] = [None] * len(tasks)
        embed = [i for i, t in enumerate(tasks) if t == "embed"]
        score = [i for i, t in enumerate(tasks) if t == "score"]
        if embed:
            vectors = F.normalize(hidden[embed].float(), dim=-1)  # [num_embed, hidden]
            for i, v in zip(embed, vectors.tolist()):
                out[i] = v
        if score:
            if self.score_token_ids is None:
                raise ValueError("this model is not a reranker: it cannot score")
            logits = model.compute_logits(hidden[score])[:, list(self.score_token_ids)]
            probs = torch.softmax(logits.float(), dim=-1)[:, 1]  # [num_score]
            for i, p in zip(score, probs.tolist()):
                out[i] = [p]
        return out
