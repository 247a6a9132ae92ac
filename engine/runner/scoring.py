"""Teacher-forced scoring: the model's next-token distributions over a given token sequence,
computed through the engine's own paged KV cache (so a quantized cache is what attention
reads, exactly as in generation: every chunk's K/V is stored first, then read back).

Used by quality checks (`appliance eval-quant`: perplexity, KL between configurations). It
borrows KV blocks from the engine's block manager for the duration of one sequence; call it
while the engine has no requests running, or with enough free blocks.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from engine.runner.forward_context import forward_context
from engine.runner.input_prep import prepare_inputs
from engine.sampling_params import SamplingParams
from engine.scheduling.request import Request
from engine.scheduling.scheduler import ScheduledBatch


def iter_next_token_logprobs(
    engine, token_ids: list[int], chunk_size: int = 256
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (targets [m] int64, logprobs [m, vocab] fp32) chunk by chunk: row i holds
    log p(token_ids[j + 1] | token_ids[: j + 1]) for the chunk's positions j, so over all
    chunks the rows cover positions 0 .. len - 2 (len - 1 predictions). Tensors live on the
    engine's device. `engine` is an LLMEngine (or LLM.engine)."""
    cfg, runner, blocks = engine.config, engine.runner, engine.block_manager
    n = len(token_ids)
    if n < 2:
        raise ValueError("scoring needs at least 2 tokens")
    if n > cfg.max_model_len:
        raise ValueError(f"{n} tokens exceed max_model_len={cfg.max_model_len}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    seq = Request("scoring", token_ids, SamplingParams(max_tokens=1), seed=0)
    if not blocks.allocate(seq, n):
        raise RuntimeError(
            f"scoring {n} tokens needs {blocks.blocks_for(n)} free KV blocks, "
            f"{blocks.num_free_blocks} are free"
        )
    if not blocks.take_state_slot(seq):  # a model with linear-attention layers
        blocks.free(seq)
        raise RuntimeError("scoring needs a free state slot; every one is held by a request")
    try:
        targets_all = torch.tensor(token_ids[1:] + [0], dtype=torch.int64)
        for lo in range(0, n - 1, chunk_size):
            hi = min(lo + chunk_size, n)  # feed tokens [lo, hi); predictions for [lo, hi - 1)
            seq.num_computed_tokens = lo
            logits = _forward_chunk(runner, seq, hi - lo)
            m = min(hi, n - 1) - lo
            logprobs = torch.log_softmax(logits[:m], dim=-1)  # [m, vocab]
            yield targets_all[lo : lo + m].to(logprobs.device), logprobs
    finally:
        blocks.free(seq)


@torch.inference_mode()
def _forward_chunk(runner, seq: Request, num_new: int) -> torch.Tensor:
    """Logits [num_new, vocab] (fp32) of seq's next num_new tokens, with the first
    seq.num_computed_tokens already cached. Inputs are prepared as for a prefill chunk."""
    batch = ScheduledBatch(requests=[seq], num_new_tokens=[num_new])
    input_ids, positions, meta, _, _ = prepare_inputs(batch, runner.block_size, runner.device)
    with forward_context(meta):
        hidden = runner.model(input_ids, positions)  # [num_new, hidden]
    return runner.model.compute_logits(hidden).float()  # [num_new, vocab]


def sequence_nll(engine, token_ids: list[int], chunk_size: int = 256) -> tuple[float, int]:
    """(total negative log-likelihood in nats, number of predicted tokens) of token_ids."""
    total, count = 0.0, 0
    for targets, logprobs in iter_next_token_logprobs(engine, token_ids, chunk_size):
        total -= float(logprobs.gather(1, targets[:, None]).sum())
        count += targets.shape[0]
    return total, count
