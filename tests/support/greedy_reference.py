"""Greedy outputs checked against a reference model (transformers) teacher-forced on them.

Comparing two implementations' greedy generations token for token fails wherever the top two
logits are closer than the implementations' numeric difference, and that difference depends
on the CPU (instruction set) or GPU each runs on. Teacher forcing runs the reference once over
prompt + our tokens, so every position is compared given the same prefix, and a near-tie
accepts either token.
"""

from __future__ import annotations

import torch

from engine.scheduling.request import RequestOutput

CLEAR_MARGIN = 1e-3
"""Logit gap below which the reference's top two tokens count as tied. Measured on the tiny
fp32 models (tests/support/tiny_models.py, CPU): our logprobs and transformers' differ by at most
1.4e-6, and the smallest top-2 gap over 640 greedy positions was 1.1e-4."""


def assert_greedy_agrees(
    reference: torch.nn.Module,
    prompts: list[list[int]],
    outputs: list[RequestOutput],
    logprob_atol: float | None = None,
    min_clear: float = 0.9,
    inputs=None,
) -> None:
    """At every generated position, our token's reference logit is within CLEAR_MARGIN of the
    reference's top logit: where the top two are further apart, our token is its top token.
    With logprob_atol, the logprob we reported equals the reference's within it. At least
    min_clear of all positions must have a clear top token, so that a model whose logits are
    all near-ties cannot pass. `inputs(i, ids)`: the reference's other inputs for prompt i
    teacher-forced with ids [1, n] (a multimodal model's pixels)."""
    device = next(reference.parameters()).device
    num_clear = num_positions = 0
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        tokens = torch.tensor(out.token_ids, device=device)
        with torch.no_grad():
            ids = torch.tensor([prompt + out.token_ids], device=device)
            extra = {} if inputs is None else inputs(i, ids)
            logits = reference(ids, **extra).logits[0, len(prompt) - 1 : -1].float()  # [n, vocab]
        top2 = logits.topk(2, dim=-1).values  # [n, 2]
        behind = top2[:, 0] - logits.gather(1, tokens[:, None])[:, 0]  # [n]
        wrong = (behind > CLEAR_MARGIN).nonzero().flatten().tolist()
        assert not wrong, (
            f"{len(prompt)}-token prompt, output position {wrong[0]}: our token "
            f"{out.token_ids[wrong[0]]} is {behind[wrong[0]].item():.3g} below the reference's "
            f"top token {logits[wrong[0]].argmax().item()}"
        )
        if logprob_atol is not None:
            ours = torch.tensor([lp.logprob for lp in out.logprobs], device=device)
            theirs = logits.log_softmax(-1).gather(1, tokens[:, None])[:, 0]
            torch.testing.assert_close(ours, theirs, atol=logprob_atol, rtol=0)
        num_clear += int((top2[:, 0] - top2[:, 1] > CLEAR_MARGIN).sum())
        num_positions += len(out.token_ids)
    assert num_positions and num_clear >= min_clear * num_positions, (
        f"only {num_clear} of {num_positions} positions have a clear top token"
    )


def generate_under_pressure(
    folder,
    reference: torch.nn.Module,
    prompts: list[list[int]],
    params,
    *,
    num_kv_blocks: int,
    step_tokens: int,
    max_model_len: int,
    logprob_atol: float | None = 1e-4,
    device: str = "cpu",
    enforce_eager: bool = False,
) -> list[RequestOutput]:
    """Generate `prompts` on `device` (fp32) with a pool of num_kv_blocks blocks and steps of
    step_tokens tokens, all prompts admitted at once. Checks that the outputs agree with
    `reference` (assert_greedy_agrees; on another device than the CPU a copy of it runs
    there), that the pool was too small (a request was preempted), that a prompt was
    prefilled in several chunks, and that every block is free afterwards. Returns the outputs
    for a test's own checks."""
    import copy

    from engine import LLM

    llm = LLM(
        str(folder),
        device=device,
        dtype="float32",
        enforce_eager=enforce_eager,
        num_kv_blocks=num_kv_blocks,
        max_num_batched_tokens=step_tokens,
        max_model_len=max_model_len,
        max_num_seqs=len(prompts),
    )
    outs = llm.generate(prompts, params)
    if device != "cpu":
        reference = copy.deepcopy(reference).to(device)
    assert_greedy_agrees(reference, prompts, outs, logprob_atol=logprob_atol)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert max(o.metrics.num_prefill_chunks for o in outs) > 1
    assert llm.engine.block_manager.num_free_blocks == num_kv_blocks  # everything returned
    return outs
