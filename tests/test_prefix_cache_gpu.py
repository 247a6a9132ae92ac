"""The prefix cache on the GPU (Triton kernels, CUDA graphs, overlapped steps): the same greedy
tokens with the cache on and off, for a shared prefix and a multi-turn conversation."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.test_prefix_cache import _ids, _in_turns

pytestmark = pytest.mark.gpu


def _llm(folder, caching: bool) -> LLM:
    return LLM(
        str(folder), device="cuda", dtype="float32", max_model_len=512, prefix_caching=caching
    )


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
