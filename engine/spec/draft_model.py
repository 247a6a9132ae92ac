"""A draft model for speculative decoding (speculative="draft:PATH"): a small model sharing the
target's tokenizer (Qwen3-0.6B for Qwen3-8B, SmolLM2-135M for SmolLM2-1.7B), loaded in the
same process, drafting its greedy continuation of each request.

Its K/V live in the target's KV blocks: the draft has its own KVPool tensors with the same
number of blocks, so a block id names the same tokens in both, the block manager and the
scheduler stay as they are, and the planner counts the draft's bytes per token in every block
(engine.planner, PlanRequest.draft_model). The drafter runs after scheduling, when the
scheduler has given each drafting request the blocks of its draft positions
(`Drafter.needs_blocks`); it writes K/V there, as the target's verify forward writes its own.

What the draft has computed is kept per request: the positions whose draft K/V are for the
request's tokens. After a verification that is min(what it computed, the target's computed
count): a rejected draft's position holds the K/V of a token the request did not keep. A
preempted request (its blocks went back to the pool) starts again from position 0, and so does
a new request, whatever a prefix-cache hit shares: a cached block's draft K/V may never have
been written (the request that filled it need not have drafted).

Drafts are greedy (q one-hot at the draft's argmax): verification is then the same as for
n-gram drafts, so every emitted token is the target's own draw for its index and outputs,
seeded ones included, are identical with speculation on and off (engine/spec/verify.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.memory.kv_pool import KVPool
from engine.models.loader import load_model, resolve_model_folder
from engine.models.model_config import ModelConfig
from engine.runner.attention_backends import select_backend
from engine.runner.forward_context import forward_context
from engine.runner.input_prep import prepare_inputs
from engine.scheduling.scheduler import ScheduledBatch
from engine.spec.drafter import Draft, Drafter, DraftInput, per_request_k


def draft_model_config(
    config: EngineConfig, target: ModelConfig
) -> tuple[Path, ModelConfig] | None:
    """The draft model's folder and config for speculative="draft:PATH", checked against the
    target (ValueError saying what to change when it cannot draft for it); None when no draft
    model is asked for, or the target has linear-attention layers (it does not speculate:
    engine/spec/step.py)."""
    if config.draft_model is None or target.linear_layer_ids():
        return None
    try:
        folder = resolve_model_folder(config.draft_model)
        draft = ModelConfig.from_folder(folder)
    except ValueError as e:
        raise ValueError(f"draft model ({config.speculative}): {e}") from e
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"the draft model {config.draft_model} has a vocabulary of {draft.vocab_size} "
            f"tokens and the target {target.vocab_size}: a draft model must share the target's "
            "tokenizer (a smaller model of the same family)"
        )
    if draft.linear_layer_ids():
        raise ValueError(
            f"the draft model {config.draft_model} has linear-attention layers, whose state a "
            "rejected draft would advance: choose a draft model with attention layers only"
        )
    return folder, draft


class DraftModel:
    """The draft model's weights and its KV pool (same blocks as the target's)."""

    def __init__(
        self,
        folder: Path,
        model_config: ModelConfig,
        config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.model_config = model_config
        self.device = device
        self.block_size = config.block_size
        self.model = load_model(
            folder,
            model_config,
            config.max_model_len,
            dtype,
            device,
            random_weights=config.load_format == "random",
        )
        self.kv_pool = KVPool.empty()

    def allocate(self, num_blocks: int, kv_dtype: torch.dtype) -> None:
        layers = self.model.attention_layers()
        self.kv_pool = KVPool.allocate(
            self.model_config, layers, num_blocks, self.block_size, kv_dtype, self.device
        )
        backend = select_backend(self.device)
        for attn in layers:
            attn.backend = backend

    def release(self) -> None:
        KVPool.unbind(self.model.attention_layers())
        self.kv_pool = KVPool.empty()

    @property
    def nbytes(self) -> int:
        return self.kv_pool.nbytes

    @torch.inference_mode()
    def greedy(self, batch: ScheduledBatch) -> list[int]:
        """One forward over `batch` (views of requests, decodes first); the argmax token of
        each sequence that reaches its last token, in batch.sampling_indices order."""
        input_ids, positions, meta, rows, _ = prepare_inputs(batch, self.block_size, self.device)
        with forward_context(meta):
            hidden = self.model(input_ids, positions)
        if not batch.sampling_indices:
            return []
        return self.model.compute_logits(hidden[rows]).argmax(-1).tolist()


@dataclass
class _View:
    """A request as the draft model sees it: its tokens followed by the drafts so far, and the
    positions the draft has computed (prepare_inputs reads these fields)."""

    request_id: str
    token_ids: list[int]
    block_table: list[int]
    num_computed_tokens: int
    k: int
    drafts: list[int] = field(default_factory=list)
    spec_tokens: list[int] = field(default_factory=list)
    num_pending: int = 0
    state_slot: None = None
    is_pooling: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class DraftModelDrafter(Drafter):
    """Drafts k greedy tokens per request with a DraftModel (module docstring)."""

    name = "draft"
    needs_blocks = True

    def __init__(self, draft: DraftModel, max_tokens_per_forward: int) -> None:
        self.draft = draft
        self.budget = max(1, max_tokens_per_forward)
        self._computed: dict[str, tuple[int, int]] = {}
        """request id -> (positions whose draft K/V are right, the request's preemptions
        then)."""

    def propose(self, requests: Sequence[DraftInput], k: int | Sequence[int]) -> list[Draft]:
        """Exactly k drafts per request (the blocks of positions num_computed_tokens ..
        num_computed_tokens + k - 1 must be allocated: called after scheduling)."""
        ks = per_request_k(requests, k)
        views = [
            _View(r.request_id, list(r.token_ids), r.block_table, self._valid(r), n)
            for r, n in zip(requests, ks)
        ]
        while True:
            active = [v for v in views if len(v.drafts) < v.k]
            if not active:
                break
            self._step(active)
        for r, v in zip(requests, views):
            if v.k:
                self._computed[r.request_id] = (v.num_computed_tokens, _preemptions(r))
        return [Draft(v.drafts) for v in views]

    def _step(self, active: list[_View]) -> None:
        """One draft forward: every active view's next tokens (all that are left to compute
        where the token budget allows, decodes first); those reaching their last token draft
        one more."""
        chosen, counts, left = [], [], self.budget
        for v in sorted(active, key=lambda v: v.num_tokens - v.num_computed_tokens > 1):
            n = min(v.num_tokens - v.num_computed_tokens, left)
            if n == 0:
                break
            chosen.append(v)
            counts.append(n)
            left -= n
        num_decodes = next((i for i, n in enumerate(counts) if n != 1), len(counts))
        batch = ScheduledBatch(chosen, counts, num_decodes)
        tokens = self.draft.greedy(batch)
        for v, n in zip(chosen, counts):
            v.num_computed_tokens += n
        for i, token in zip(batch.sampling_indices, tokens):
            chosen[i].drafts.append(token)
            chosen[i].token_ids.append(token)

    def _valid(self, req) -> int:
        """Positions whose draft K/V are for req's tokens (see the module docstring)."""
        stored = self._computed.get(req.request_id)
        if stored is None or stored[1] != _preemptions(req):
            return 0
        return min(stored[0], req.num_computed_tokens)

    def release(self, request_id: str) -> None:
        self._computed.pop(request_id, None)


def _preemptions(req) -> int:
    metrics = getattr(req, "metrics", None)
    return metrics.num_preemptions if metrics is not None else 0
