"""Automatic prefix caching through the engine, on a tiny random-weight model: the same greedy
tokens and logprobs with the cache on and off (shared prefixes, a multi-turn conversation,
forced preemption, chunked prefill inside a cached block, the int8 KV cache, n > 1), the hit
counters, and a cache full of other prefixes evicted rather than refused."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams

BLOCK = 16
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def _llm(folder, caching: bool, **config) -> LLM:
    config = {"max_model_len": 512, "max_num_seqs": 8, "block_size": BLOCK, **config}
    return LLM(str(folder), device="cpu", dtype="float32", prefix_caching=caching, **config)


def _summary(outs):
    return [(o.token_ids, o.finish_reason) for o in outs]


def _assert_same(a, b):
    assert _summary(a) == _summary(b)
    for x, y in zip(a, b, strict=True):
        got = [lp.logprob for lp in x.logprobs]
        want = [lp.logprob for lp in y.logprobs]
        assert got == pytest.approx(want, abs=1e-4)


def _in_turns(llm: LLM, batches: list[list[list[int]]]):
    """Each batch runs after the last has finished (so its blocks are cached)."""
    return [o for prompts in batches for o in llm.generate(prompts, GREEDY)]


def test_shared_prefixes_give_the_uncached_tokens(tiny_llama):
    system = _ids(70, 1)  # four full blocks and a part
    first = [system + _ids(5 + i, 10 + i) for i in range(3)]
    second = [system + _ids(9 + i, 20 + i) for i in range(4)] + [_ids(40, 30)]
    cached = _llm(tiny_llama, True)
    outs = _in_turns(cached, [first, second])
    _assert_same(outs, _in_turns(_llm(tiny_llama, False), [first, second]))
    hits = [o.num_cached_tokens for o in outs]
    assert hits[3:7] == [4 * BLOCK] * 4 and hits[7] == 0  # the system prompt's full blocks
    stats = cached.engine.stats()
    total = sum(len(p) for p in first + second)
    assert stats["prefix_cache_queries_total"] == total
    assert stats["prefix_cache_hits_total"] == sum(hits) > 0
    hit = next(o for o in outs if o.num_cached_tokens)
    assert any(e.event == "prefix_cache_hit" for e in hit.trace)


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_requests_admitted_in_one_step_share_what_the_first_computes(tiny_llama, kv):
    """The first request's full blocks are keyed when its step is scheduled, so the others in
    that step read them (each layer stores the batch's K/V before attention reads it)."""
    system = _ids(3 * BLOCK, 11)
    prompts = [system + _ids(5 + i, 80 + i) for i in range(4)]
    llm = _llm(tiny_llama, True, kv_cache_dtype=kv)
    cached = llm.generate(prompts, GREEDY)
    plain = _llm(tiny_llama, False, kv_cache_dtype=kv).generate(prompts, GREEDY)
    if kv == "auto":
        _assert_same(cached, plain)
    else:  # int8 K/V read back equals int8 K/V written: the same tokens
        assert _summary(cached) == _summary(plain)
    assert [o.num_cached_tokens for o in cached] == [0] + [3 * BLOCK] * 3


def test_a_multi_turn_conversation_hits_its_earlier_turns(tiny_llama):
    def run(caching: bool):
        llm, history, outs = _llm(tiny_llama, caching), [], []
        for turn in range(4):
            history = history + _ids(20, 100 + turn)
            out = llm.generate([history], GREEDY)[0]
            outs.append(out)
            history = history + out.token_ids
        return outs

    cached, plain = run(True), run(False)
    _assert_same(cached, plain)
    for turn in range(1, 4):  # the earlier prompt and answer, in whole blocks
        previous = len(cached[turn - 1].prompt_token_ids) + len(cached[turn - 1].token_ids) - 1
        assert cached[turn].num_cached_tokens == previous // BLOCK * BLOCK


def test_preemption_with_a_tight_pool_gives_the_same_tokens(tiny_llama):
    system = _ids(40, 3)
    prompts = [system + _ids(8 + 3 * i, 40 + i) for i in range(6)]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, logprobs=1)
    tight = {"num_kv_blocks": 14, "max_model_len": 96, "max_num_batched_tokens": 64}
    cached = _llm(tiny_llama, True, **tight)
    outs = cached.generate(prompts, params)
    plain = _llm(tiny_llama, False, **tight).generate(prompts, params)
    _assert_same(outs, plain)
    assert cached.engine.scheduler.num_preemptions > 0
    assert cached.engine.block_manager.num_free_blocks == 14  # nothing leaked


def test_chunked_prefill_splits_inside_a_cached_block(tiny_llama):
    system = _ids(3 * BLOCK, 5)
    prompts = [[system + _ids(50, 60)], [system + _ids(61, 61), system + _ids(33, 62)]]
    chunked = {"max_num_batched_tokens": 24}  # chunks of 24 tokens cross block edges
    cached = _in_turns(_llm(tiny_llama, True, **chunked), prompts)
    _assert_same(cached, _in_turns(_llm(tiny_llama, False, **chunked), prompts))
    assert [o.num_cached_tokens for o in cached[1:]] == [3 * BLOCK, 3 * BLOCK]


def test_int8_kv_cache_hits_give_the_uncached_tokens(tiny_llama):
    system = _ids(50, 7)
    batches = [[system + _ids(6, 70)], [system + _ids(7, 71), system + _ids(12, 72)]]
    int8 = {"kv_cache_dtype": "int8"}
    cached = _in_turns(_llm(tiny_llama, True, **int8), batches)
    assert _summary(cached) == _summary(_in_turns(_llm(tiny_llama, False, **int8), batches))
    assert [o.num_cached_tokens for o in cached[1:]] == [3 * BLOCK, 3 * BLOCK]


def test_n_choices_of_one_prompt_share_its_blocks(tiny_llama):
    prompt = _ids(64, 8)  # four full blocks: the last is recomputed for its logits
    seeded = [SamplingParams(max_tokens=10, temperature=0.9, seed=s) for s in range(4)]
    llm = _llm(tiny_llama, True)
    first = llm.generate([prompt], seeded[:1])[0]
    rest = llm.generate([prompt] * 3, seeded[1:])
    plain = _llm(tiny_llama, False).generate([prompt] * 4, seeded)
    assert [o.token_ids for o in [first, *rest]] == [o.token_ids for o in plain]
    assert [o.num_cached_tokens for o in rest] == [3 * BLOCK] * 3


def test_a_cache_full_of_other_prefixes_is_evicted_not_refused(tiny_llama):
    llm = _llm(tiny_llama, True, num_kv_blocks=24, max_model_len=128)
    for i in range(12):  # far more prefixes than the pool holds
        out = llm.generate([_ids(100, 200 + i)], GREEDY)[0]
        assert out.finish_reason == "length" and out.num_cached_tokens == 0
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == 24 and 0 < bm.num_cached_blocks <= 24
    again = llm.generate([_ids(100, 211)], GREEDY)[0]  # the most recent one is still there
    assert again.num_cached_tokens == 96


def test_a_cache_salt_hits_only_its_own_prefixes(tiny_llama):
    prompt = _ids(40, 10)
    llm = _llm(tiny_llama, True)

    def hit(salt):
        params = SamplingParams(max_tokens=2, temperature=0.0, cache_salt=salt)
        return llm.generate([prompt], params)[0].num_cached_tokens

    assert [hit("a"), hit("b"), hit(None), hit("a"), hit(None), hit("b")] == [0, 0, 0] + [32] * 3
    with pytest.raises(ValueError, match="cache_salt"):
        SamplingParams(cache_salt="")


def test_caching_off_hits_nothing(tiny_llama):
    prompt = _ids(80, 9)
    llm = _llm(tiny_llama, False)
    outs = _in_turns(llm, [[prompt], [prompt]])
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    assert llm.engine.stats()["prefix_cache_hits_total"] == 0
    assert llm.engine.block_manager.num_cached_blocks == 0
