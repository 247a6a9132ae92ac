"""Greedy outputs of our engine agree with transformers with the same weights: teacher-forced
on our tokens, transformers picks the same token wherever its top two logits are apart, and
gives each token the log-probability we report (tests/greedy_reference.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from tests.support.greedy_reference import assert_greedy_agrees, generate_under_pressure

PROMPT_LENS = [1, 3, 7, 16, 17, 33, 60, 100]
NEW_TOKENS = 20


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def reference(tiny_model):
    """transformers' model of each architecture, with the weights our engine loads."""
    arch, folder = tiny_model
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
LOGPROB_ATOL = 1e-4
"""Ours against transformers' fp32 log-probabilities; measured at most 1.4e-6 (CPU)."""


def test_batched_greedy_agrees_with_transformers(reference):
    folder, hf = reference
    llm = LLM(str(folder), device="cpu")
    outs = llm.generate(_prompts(), GREEDY)
    assert len({tuple(o.token_ids) for o in outs}) > 1, "outputs are degenerate"
    assert_greedy_agrees(hf, _prompts(), outs)
    assert all(o.finish_reason == "length" for o in outs)


def test_agrees_under_preemption_and_chunked_prefill(reference):
    folder, hf = reference
    # 12 blocks x 16 tokens for 8 prompts up to 120 tokens each: the pool cannot hold them all,
    # and a 24-token step budget forces long prompts to be split into chunks.
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    generate_under_pressure(
        folder, hf, _prompts(), params, num_kv_blocks=12, step_tokens=24, max_model_len=160
    )


def test_the_check_rejects_a_wrong_token_and_a_wrong_logprob(tiny_llama):
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)
    out = LLM(str(tiny_llama), device="cpu").generate(_prompts()[4:5], params)[0]
    assert_greedy_agrees(hf, _prompts()[4:5], [out], logprob_atol=LOGPROB_ATOL)
    runner_up = copy.deepcopy(out)
    runner_up.token_ids[0] = out.logprobs[0].top[1][0]  # the second most likely first token
    with pytest.raises(AssertionError, match="output position 0"):
        assert_greedy_agrees(hf, _prompts()[4:5], [runner_up])
    shifted = copy.deepcopy(out)
    shifted.logprobs[3].logprob += 1e-3
    with pytest.raises(AssertionError):
        assert_greedy_agrees(hf, _prompts()[4:5], [shifted], logprob_atol=LOGPROB_ATOL)


def test_sharded_checkpoint_loads_the_same(tiny_llama, tmp_path):
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    for f in tiny_llama.glob("tokenizer*"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    prompts = _prompts()[:3]
    a = LLM(str(tiny_llama), device="cpu").generate(prompts, GREEDY)
    b = LLM(str(tmp_path), device="cpu").generate(prompts, GREEDY)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_abort_frees_blocks_at_once(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu")
    engine = llm.engine
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    engine.add_request("a", list(range(1, 40)), params)
    engine.add_request("b", list(range(100, 159)), params)  # shares no block with a
    for _ in range(3):
        engine.step()
    used = engine.block_manager.num_used_blocks
    engine.abort("b")
    assert engine.block_manager.num_used_blocks == used - 4  # 62 tokens -> 4 blocks of 16
    outs = {o.request_id: o for o in engine.step()}
    assert outs["b"].finished and outs["b"].finish_reason == "abort"
    assert len(outs["b"].token_ids) == 3
    while engine.has_unfinished():
        for o in engine.step():
            assert o.request_id == "a"
    assert engine.block_manager.num_used_blocks == 0


def test_warm_up_leaves_a_clean_engine(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu", max_num_batched_tokens=64)
    llm.engine.warm_up()
    assert llm.engine.block_manager.num_used_blocks == 0
    assert llm.engine.stats()["num_steps"] == 0 and not llm.engine.has_unfinished()


def _first_step_tokens(engine, run) -> int:
    """Tokens scheduled by the first step of run()."""
    first, schedule = [], engine.scheduler.schedule

    def recording():
        batch = schedule()
        if not first:
            first.append(sum(batch.num_new_tokens))
        return batch

    engine.scheduler.schedule = recording
    run()
    engine.scheduler.schedule = schedule
    return first[0]


def test_warm_up_starts_with_a_full_budget_step_when_prompts_are_shorter(tiny_llama):
    """max_model_len below max_num_batched_tokens: the first warm-up step still schedules the
    whole token budget (several prompts), so the memory check sees the serving peak."""
    llm = LLM(str(tiny_llama), device="cpu", max_model_len=40, max_num_batched_tokens=100)
    engine = llm.engine
    first = [_first_step_tokens(engine, engine.warm_up)]
    assert first == [100]
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()


def test_peak_step_fills_the_budget_beside_max_num_seqs_sequences(tiny_llama):
    llm = LLM(
        str(tiny_llama), device="cpu", max_model_len=40, max_num_batched_tokens=100, max_num_seqs=8
    )
    engine = llm.engine
    assert _first_step_tokens(engine, engine.run_peak_step) == 100
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()
