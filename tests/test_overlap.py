"""Overlapped steps (launch step N+1 before reading step N's tokens back) give exactly the
outputs of the plain loop: same tokens, same finish reasons, stops honoured, nothing leaked.

The overlap path is on by default only on a GPU; here it is switched on for the CPU engine,
where every "device" op completes at once but the bookkeeping (placeholders, one-step-late
stop rules, device-side input fill) runs just as it does on a GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine import LLM, SamplingParams
from engine.runner.input_prep import PendingFill
from engine.scheduling.request import PLACEHOLDER


def _prompts(n: int = 8) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [
        torch.randint(0, 256, (k,), generator=g).tolist() for k in (1, 5, 17, 30, 64, 9, 2, 41)[:n]
    ]


def _llm(folder, overlap: bool, **config) -> LLM:
    llm = LLM(str(folder), device="cpu", **config)
    llm.engine._overlap = overlap
    return llm


def _mixed_params() -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=9, temperature=0.9, seed=5, ignore_eos=True),
        SamplingParams(max_tokens=15, temperature=0.7, top_k=20, top_p=0.9, seed=1),
        SamplingParams(max_tokens=10, temperature=0.0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=0.0, logprobs=3, ignore_eos=True),
        SamplingParams(max_tokens=14, temperature=1.0, frequency_penalty=0.5, seed=9),
        SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=11, temperature=0.0, min_p=0.1, ignore_eos=True),
    ]


def _summary(outs) -> list[tuple]:
    return [
        (
            o.token_ids,
            o.finish_reason,
            o.stop_reason,
            [(lp.token_id, round(lp.logprob, 4)) for lp in o.logprobs or []],
        )
        for o in outs
    ]


def _without_penalties() -> list[SamplingParams]:
    """Penalties read output tokens on the host, which makes those steps wait (no overlap)."""
    return [p for p in _mixed_params() if not p.has_penalties]


@pytest.mark.parametrize("pool", [None, 10])
@pytest.mark.parametrize("params", [_mixed_params, _without_penalties])
def test_overlap_equals_plain_loop(tiny_llama, pool, params, monkeypatch):
    fills = []
    apply = PendingFill.apply
    monkeypatch.setattr(PendingFill, "apply", lambda *a: fills.append(1) or apply(*a))
    config = dict(max_model_len=128, max_num_batched_tokens=32, max_num_seqs=16)
    if pool is not None:
        config["num_kv_blocks"] = pool  # 10 blocks of 16 tokens: forces preemption
    prompts = _prompts(len(params()))
    plain = _llm(tiny_llama, False, **config).generate(prompts, params())
    assert not fills
    overlapped_llm = _llm(tiny_llama, True, **config)
    overlapped = overlapped_llm.generate(prompts, params())
    assert _summary(overlapped) == _summary(plain)
    assert len(fills) > (5 if params is _without_penalties else 0)  # input tokens from device
    if pool is not None:
        assert overlapped_llm.engine.scheduler.num_preemptions > 0
    engine = overlapped_llm.engine
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()


def test_stop_token_ends_the_request_one_step_late_without_extra_tokens(tiny_llama):
    probe = _llm(tiny_llama, False).generate(
        _prompts(1), SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    )[0]
    stop_at = probe.token_ids[3]
    first = probe.token_ids.index(stop_at)
    params = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_at])
    out = _llm(tiny_llama, True).generate(_prompts(1), params)[0]
    assert out.token_ids == probe.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


def test_a_penalised_request_ending_on_a_stop_token_gives_the_plain_loop_tokens(tiny_llama):
    """Penalties read the pending token back before the forward; the token that ends the
    request then arrives while the request is in the step being launched."""
    params = SamplingParams(max_tokens=12, temperature=0.0, repetition_penalty=1.3)
    probe = _llm(tiny_llama, False).generate(_prompts(1), replace(params, ignore_eos=True))[0]
    stop_at = probe.token_ids[4]
    first = probe.token_ids.index(stop_at)
    params = replace(params, stop_token_ids=[stop_at])
    llm = _llm(tiny_llama, True)
    out = llm.generate(_prompts(1), params)[0]
    assert out.token_ids == probe.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    assert llm.engine.block_manager.num_used_blocks == 0


def test_streamed_outputs_never_show_placeholders_and_abort_frees_blocks(tiny_llama):
    llm = _llm(tiny_llama, True, max_model_len=128)
    engine = llm.engine
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(_prompts(4)):
        engine.add_request(f"r{i}", p, params)
    seen: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            assert PLACEHOLDER not in out.token_ids
            prev = seen.get(out.request_id, [])
            assert out.token_ids[: len(prev)] == prev  # cumulative, never rewritten
            seen[out.request_id] = out.token_ids
        steps += 1
        if steps == 6:
            engine.abort("r1")
    assert len(seen["r1"]) < 20
    assert all(len(seen[f"r{i}"]) == 20 for i in (0, 2, 3))
    assert engine.block_manager.num_used_blocks == 0
    assert engine.generation_tokens_total >= 60
