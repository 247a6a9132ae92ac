"""BERT encoders: embedding models (BertModel, pooled by the runner's Pooler) and
cross-encoders (BertForSequenceClassification, scored by `classify`). Bidirectional attention
over each whole prompt, no KV cache: the scheduler runs an encoder's prompts whole
(Scheduler(whole_prompts=True)), so one step holds every token of each sequence.

Module names follow transformers' BERT, so a checkpoint's tensors copy in by name ("bert."
prefix dropped). Token types: a sequence's tokens after its first [SEP] are segment 1, as the
tokenizer marks a (query, document) pair."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.model_config import ModelConfig
from engine.runner.forward_context import get_context


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)


class _Output(nn.Module):
    def __init__(self, d_in: int, d_out: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.self = _SelfAttention(hidden)
        self.output = _Output(hidden, hidden, eps)


class _Dense(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.attention = _Attention(cfg.hidden_size, eps)
        self.intermediate = _Dense(cfg.hidden_size, cfg.intermediate_size)
        self.output = _Output(cfg.intermediate_size, cfg.hidden_size, eps)

    def forward(self, x: torch.Tensor, starts: list[int]) -> torch.Tensor:
        sa = self.attention.self
        shape = (-1, self.num_heads, self.head_dim)
        q, k, v = (p(x).view(shape).transpose(0, 1) for p in (sa.query, sa.key, sa.value))
        # [num_heads, num_tokens, head_dim]; each sequence attends to itself alone
        out = torch.cat(
            [
                F.scaled_dot_product_attention(q[:, s:e], k[:, s:e], v[:, s:e])
                for s, e in zip(starts, starts[1:])
            ],
            dim=1,
        )
        h = self.attention.output(out.transpose(0, 1).reshape(x.shape), x)
        return self.output(F.gelu(self.intermediate.dense(h)), h)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig, type_vocab_size: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class _Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))


class BertModel(nn.Module):
    """`forward(input_ids, positions)` -> [num_tokens, hidden] final hidden states."""

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        extra = cfg.encoder or {}
        self.embeddings = BertEmbeddings(cfg, extra.get("type_vocab_size", 2))
        self.encoder = _Encoder(cfg)
        num_labels = extra.get("num_labels", 0)
        self.pooler = _Dense(cfg.hidden_size, cfg.hidden_size) if num_labels else None
        self.classifier = nn.Linear(cfg.hidden_size, num_labels) if num_labels else None
        self.sep_token_id: int | None = None
        """Set from the tokenizer: the tokens after a sequence's first one are segment 1."""
        self.embed_tokens = None  # nothing to tie (the loader asks)

    def _token_types(self, input_ids: torch.Tensor, starts: list[int]) -> torch.Tensor:
        if self.sep_token_id is None:
            return torch.zeros_like(input_ids)
        is_sep = (input_ids == self.sep_token_id).long()
        types = []
        for s, e in zip(starts, starts[1:]):
            seen = torch.cumsum(is_sep[s:e], 0) - is_sep[s:e]  # SEPs strictly before each token
            types.append((seen > 0).long())
        return torch.cat(types)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        meta = get_context()
        starts = list(meta.query_start_loc_cpu)
        lengths = [e - s for s, e in zip(starts, starts[1:])]
        if list(meta.seq_lens_cpu) != lengths:
            raise RuntimeError("an encoder runs each prompt whole, in one step")
        emb = self.embeddings
        x = emb.word_embeddings(input_ids) + emb.position_embeddings(positions)
        x = emb.LayerNorm(x + emb.token_type_embeddings(self._token_types(input_ids, starts)))
        for layer in self.encoder.layer:
            x = layer(x, starts)
        return x  # [num_tokens, hidden]

    def classify(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        """[num_seqs, num_labels] logits of a cross-encoder from its sequences' [CLS] states."""
        return self.classifier(torch.tanh(self.pooler.dense(cls_hidden)))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise ValueError("an encoder model generates no tokens")

    def attention_layers(self) -> list:
        return []

    def linear_layers(self) -> list:
        return []

    def init_buffers(self, device: torch.device) -> None:
        pass

    @torch.no_grad()
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        copy: Callable[[torch.Tensor, torch.Tensor], object] = torch.Tensor.copy_,
    ) -> None:
        """Copy transformers-named tensors in; a parameter the checkpoint lacks is an error."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            name = name.removeprefix("bert.")
            if name in params:
                copy(params[name], tensor)
                loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} tensor(s): {missing[:5]}")
