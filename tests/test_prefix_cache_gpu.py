"""The prefix cache on the GPU (Triton kernels, CUDA graphs, overlapped steps): the same greedy
tokens with the cache on and off, for a shared prefix and a multi-turn conversation."""

from __future__ import annotations

import gc

import pytest
import torch

from engine import LLM, SamplingParams
from tests.test_prefix_cache import _ids, _in_turns

pytestmark = pytest.mark.gpu


def _llm(folder, caching: bool, **config) -> LLM:
    """A pinned, small KV pool: a planned one fills the GPU's budget, and the tests here build
    several engines in one process."""
    return LLM(
        str(folder),
        device="cuda",
        dtype="float32",
        max_model_len=512,
        num_kv_blocks=256,
        prefix_caching=caching,
        **config,
    )


def _generate_and_free(folder, caching: bool, prompts, params, **config):
    """Outputs of a fresh engine, whose GPU memory is then handed back (the next engine plans
    with what is free)."""
    llm = _llm(folder, caching, **config)
    outs = llm.generate(prompts, params)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return outs


def test_gpu_cache_hits_give_the_uncached_tokens(tiny_llama):
    system = _ids(70, 1)
    batches = [[system + _ids(5, 10)], [system + _ids(9 + i, 20 + i) for i in range(6)]]
    history = _ids(30, 3)
    for turn in range(3):
        batches.append([history])
        history = history + _ids(20, 40 + turn)  # the next turn extends the last prompt
    on, off = _llm(tiny_llama, True), _llm(tiny_llama, False)
    cached, plain = _in_turns(on, batches), _in_turns(off, batches)
    assert [o.token_ids for o in cached] == [o.token_ids for o in plain]
    assert all(o.num_cached_tokens == 64 for o in cached[1:7])
    assert on.engine.stats()["prefix_cache_hits_total"] > 6 * 64
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    assert on.generate([system], greedy)[0].num_cached_tokens == 64


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_gpu_requests_in_one_step_read_the_prefix_the_first_writes(tiny_llama, kv):
    """The Triton store and attention kernels: the later requests of a step read the blocks
    the first one writes in that same step."""
    system = _ids(48, 11)
    prompts = [system + _ids(5 + i, 80 + i) for i in range(6)]
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    cached = _generate_and_free(tiny_llama, True, prompts, greedy, kv_cache_dtype=kv)
    plain = _generate_and_free(tiny_llama, False, prompts, greedy, kv_cache_dtype=kv)
    assert [o.token_ids for o in cached] == [o.token_ids for o in plain]
    assert [o.num_cached_tokens for o in cached] == [0] + [48] * 5
