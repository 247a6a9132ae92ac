"""GPU engine (Triton kernels, CUDA graphs) against transformers with the same weights: greedy
tokens checked with transformers teacher-forced on them (tests/greedy_reference.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from tests.support.greedy_reference import assert_greedy_agrees

pytestmark = pytest.mark.gpu

LENS = [1, 5, 17, 64, 130, 300]


def _prompts():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in LENS]


def _hf(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda()


@pytest.mark.parametrize("eager", [True, False])
def test_gpu_greedy_agrees_with_transformers_fp32(tiny_model, eager):
    arch, folder = tiny_model
    llm = LLM(str(folder), device="cuda", dtype="float32", enforce_eager=eager, max_num_seqs=8)
    assert llm.engine.runner.backend.name == "triton"
    assert (llm.engine.runner.graphs is None) == eager
    outs = llm.generate(_prompts(), SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert_greedy_agrees(_hf(folder), _prompts(), outs)


def test_gpu_preemption_and_chunking_agree(tiny_llama):
    llm = LLM(
        str(tiny_llama),
        device="cuda",
        dtype="float32",
        num_kv_blocks=30,
        max_num_batched_tokens=64,
        max_model_len=400,
        max_num_seqs=8,
    )
    outs = llm.generate(_prompts(), SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert_greedy_agrees(_hf(tiny_llama), _prompts(), outs)
    assert sum(o.metrics.num_preemptions for o in outs) > 0


def test_gpu_bf16_logits_close_to_transformers(tiny_llama):
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16).cuda()
    llm = LLM(str(tiny_llama), device="cuda", dtype="bfloat16", max_num_seqs=4)
    prompt = _prompts()[4]
    out = llm.generate(
        [prompt], SamplingParams(max_tokens=1, temperature=0.0, logprobs=5, ignore_eos=True)
    )[0]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt], device="cuda")).logits[0, -1].float().log_softmax(-1)
    ours = dict(out.logprobs[0].top)
    for token, lp in ours.items():
        assert abs(ref[token].item() - lp) < 0.05


def test_gpu_seeded_sampling_matches_cpu(tiny_llama):
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=5, ignore_eos=True)
    gpu = LLM(str(tiny_llama), device="cuda", dtype="float32").generate([_prompts()[3]], params)
    cpu = LLM(str(tiny_llama), device="cpu").generate([_prompts()[3]], params)
    assert gpu[0].token_ids == cpu[0].token_ids
