"""Speculative decoding in the engine's step loop (speculative="ngram"): the same tokens as
without it, greedy and seeded, at several k, under preemption, with stop tokens and stop
strings that land inside a step's accepted drafts; counters and KV blocks add up."""

from __future__ import annotations

import re

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.request import Request
from engine.scheduling.scheduler import Scheduler
from engine.spec.draft_length import Acceptance, CostTable
from engine.spec.drafter import Draft, Drafter, per_request_k
from engine.spec.measure import MAX_SPECULATIVE_TOKENS
from engine.structured import StructuredOutput

NEW_TOKENS = 40


def _prompts() -> list[list[int]]:
    """Prompts that repeat a random segment, so the n-gram drafter finds matches (and the
    tiny model's output, which loops, gives it more)."""
    g = torch.Generator().manual_seed(1)
    segments = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 9, 13, 21)]
    return [seg * reps for seg, reps in zip(segments, (6, 4, 3, 2))]


GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
REGEX = StructuredOutput("regex", "[a-z]{8,20}")


def _spec(folder, k: int | None = None, **config) -> LLM:
    return LLM(str(folder), device="cpu", speculative="ngram", num_speculative_tokens=k, **config)


def _record_steps(llm: LLM) -> list[tuple[str, int, int]]:
    """(request id, output index of the first token, tokens emitted) of every request in every
    speculative step from now on."""
    steps = []
    spec = llm.engine.spec
    apply = spec.apply

    def recording(scheduler, batch, emitted):
        for i, tokens in emitted.items():
            req = batch.requests[i]
            steps.append((req.request_id, req.num_output_tokens - req.num_pending, len(tokens)))
        return apply(scheduler, batch, emitted)

    spec.apply = recording
    return steps


def _assert_all_returned(llm: LLM) -> None:
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert not any(bm.ref_counts)


@pytest.fixture(scope="module")
def plain(tiny_llama):
    """The outputs without speculation."""
    return LLM(str(tiny_llama), device="cpu").generate(_prompts(), GREEDY)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_tokens_are_the_same_at_each_k(tiny_llama, plain, k):
    llm = _spec(tiny_llama, k)
    outs = llm.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert all(o.finish_reason == "length" for o in outs)
    c = llm.engine.spec.counters
    assert 0 < c.num_accepted_tokens < c.num_draft_tokens  # some accepted, some rejected
    assert sum(o.metrics.num_accepted_tokens for o in outs) == c.num_accepted_tokens
    assert sum(o.metrics.num_draft_tokens for o in outs) == c.num_draft_tokens
    assert c.num_draft_tokens <= k * c.num_drafts
    stats = llm.engine.stats()["spec_decode"]
    assert stats["acceptance_rate"] == c.num_accepted_tokens / c.num_draft_tokens
    assert stats["mean_accepted_length"] == c.num_accepted_tokens / c.num_drafts
    assert llm.engine.generation_tokens_total == len(_prompts()) * NEW_TOKENS
    _assert_all_returned(llm)


def test_default_k_and_off_by_default(tiny_llama):
    assert LLM(str(tiny_llama), device="cpu").engine.spec is None
    adaptive = _spec(tiny_llama).engine.spec
    assert adaptive.adaptive and adaptive.policy is not None
    assert adaptive.k == MAX_SPECULATIVE_TOKENS
    pinned = _spec(tiny_llama, 3).engine.spec
    assert not pinned.adaptive and pinned.policy is None and pinned.k == 3
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        _spec(tiny_llama, 0)
    with pytest.raises(ValueError, match="speculative"):
        LLM(str(tiny_llama), device="cpu", speculative="eagle")


def test_same_tokens_under_preemption_and_chunked_prefill(tiny_llama, plain):
    # 14 blocks x 16 tokens for 4 sequences of 70-82 tokens: the pool cannot hold them all;
    # 24-token steps split the prompts into chunks and trim the drafts to the budget.
    config = dict(num_kv_blocks=14, max_num_batched_tokens=24, max_model_len=128, max_num_seqs=4)
    llm = _spec(tiny_llama, 8, **config)
    outs = llm.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert llm.engine.spec.counters.num_accepted_tokens > 0
    _assert_all_returned(llm)


def _inside_accepted(steps, request_id: str, output: list[int], ok) -> int:
    """An output index whose token a step emitted as an accepted draft with more tokens after
    it, for which ok(index) holds."""
    for rid, start, count in steps:
        for index in range(start, start + count - 1):
            if rid == request_id and ok(index):
                return index
    raise AssertionError(f"no accepted draft of {request_id} fits the test")


class OracleDrafter(Drafter):
    """Drafts the reference outputs' next tokens: every draft is accepted under greedy
    decoding, so a step emits k + 1 tokens and a stop can fall on any of them."""

    name = "oracle"

    def __init__(self, references: list[list[int]]) -> None:
        self.references = references

    def propose(self, requests, k):
        drafts = []
        for req, num in zip(requests, per_request_k(requests, k)):
            known = req.token_ids[: len(req.token_ids) - req.num_pending]
            ref = next(r for r in self.references if r[: len(known)] == known)
            drafts.append(Draft(ref[len(known) : len(known) + num]))
        return drafts


def _oracle(folder, plain) -> LLM:
    llm = _spec(folder, 8)
    llm.engine.spec.drafter = OracleDrafter([p + o.token_ids for p, o in zip(_prompts(), plain)])
    return llm


def test_stop_token_inside_accepted_drafts(tiny_llama, plain):
    llm = _oracle(tiny_llama, plain)
    steps = _record_steps(llm)
    llm.generate(_prompts()[:1], GREEDY)
    # the prefill's token, then 5 steps of 9, 9, 9, 9, 3 tokens (drafts stop at max_tokens)
    assert llm.engine.spec.counters.num_drafts == 5
    assert llm.engine.spec.counters.num_accepted_tokens == NEW_TOKENS - 1 - 5
    out = plain[0].token_ids
    index = _inside_accepted(steps, "offline-0", out, lambda i: out[i] not in out[:i])
    params = SamplingParams(
        max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, stop_token_ids=[out[index]]
    )
    stopped = llm.generate(_prompts()[:1], params)[0]
    off = LLM(str(tiny_llama), device="cpu").generate(_prompts()[:1], params)[0]
    assert stopped.token_ids == off.token_ids == out[: index + 1]
    assert stopped.finish_reason == off.finish_reason == "stop"
    assert stopped.stop_reason == out[index]
    _assert_all_returned(llm)


def test_stop_string_inside_accepted_drafts(tiny_llama, plain):
    llm = _oracle(tiny_llama, plain)
    steps = _record_steps(llm)
    llm.generate(_prompts(), GREEDY)
    decode = llm.tokenizer.decode
    for i, rid in enumerate(f"offline-{i}" for i in range(len(plain))):
        out = plain[i].token_ids

        def fits(index, out=out):
            # a printable ASCII token whose character first appears in the text there
            return 32 < out[index] < 127 and chr(out[index]) not in decode(out[:index])

        try:
            index = _inside_accepted(steps, rid, out, fits)
            break
        except AssertionError:
            continue
    else:
        raise AssertionError("no printable token inside accepted drafts")
    params = SamplingParams(
        max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, stop=[chr(out[index])]
    )
    stopped = llm.generate([_prompts()[i]], params)[0]
    off = LLM(str(tiny_llama), device="cpu").generate([_prompts()[i]], params)[0]
    assert stopped.token_ids == off.token_ids == out[: index + 1]
    assert stopped.text == off.text == decode(out[:index])
    assert stopped.finish_reason == off.finish_reason == "stop"
    assert stopped.stop_reason == chr(out[index])
    _assert_all_returned(llm)


SEEDED = [
    SamplingParams(max_tokens=NEW_TOKENS, temperature=0.7, seed=3, ignore_eos=True),
    SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, top_k=5, seed=4, ignore_eos=True),
    SamplingParams(max_tokens=NEW_TOKENS, temperature=0.5, top_p=0.9, seed=5, logprobs=2),
    SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, repetition_penalty=1.1, ignore_eos=True),
]


def test_seeded_sampling_is_the_same_on_and_off(tiny_llama):
    params = SEEDED
    off = LLM(str(tiny_llama), device="cpu").generate(_prompts(), params)
    llm = _spec(tiny_llama, 4)
    on = llm.generate(_prompts(), params)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert [o.finish_reason for o in on] == [o.finish_reason for o in off]
    lp_on, lp_off = on[2].logprobs, off[2].logprobs
    assert [lp.token_id for lp in lp_on] == [lp.token_id for lp in lp_off]
    assert [lp.logprob for lp in lp_on] == pytest.approx([lp.logprob for lp in lp_off], abs=1e-4)
    assert llm.engine.spec.counters.num_accepted_tokens > 0
    _assert_all_returned(llm)


def test_requests_with_a_grammar_do_not_draft_and_the_rest_are_unchanged(tiny_llama, plain):
    params = [
        SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, structured=REGEX),
        GREEDY,
        SamplingParams(max_tokens=NEW_TOKENS, seed=6, structured=StructuredOutput.choice(["x"])),
        GREEDY,
    ]
    off = LLM(str(tiny_llama), device="cpu").generate(_prompts(), params)
    llm = _spec(tiny_llama, 4)
    on = llm.generate(_prompts(), params)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert [on[1].token_ids, on[3].token_ids] == [plain[1].token_ids, plain[3].token_ids]
    assert re.fullmatch(REGEX.value, on[0].text) and on[2].text == "x"
    assert [o.metrics.num_draft_tokens > 0 for o in on] == [False, True, False, True]
    assert [any(e.event == "spec" for e in o.trace) for o in on] == [False, True, False, True]
    _assert_all_returned(llm)


def test_a_grammar_request_starting_beside_drafting_ones_is_masked_on_its_row(tiny_llama):
    """Its first token is sampled in a step where other requests verify drafts and come before
    it in the batch: the mask must land on its row of the logits, not on a draft's."""
    regex = SamplingParams(max_tokens=12, temperature=0.0, structured=REGEX)
    alone = LLM(str(tiny_llama), device="cpu").generate(_prompts()[:1], regex)[0]
    engine = _spec(tiny_llama, 8).engine
    for i in (1, 3):
        engine.add_request(f"free-{i}", _prompts()[i], GREEDY)
    while engine.spec.counters.num_drafts < 3:
        engine.step()
    engine.add_request("constrained", _prompts()[0], regex)
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert final["constrained"].token_ids == alone.token_ids
    assert re.fullmatch(REGEX.value, final["constrained"].text)


def _two_decodes(num_blocks: int, budget: int) -> tuple[Scheduler, Request, Request]:
    """Two requests past their 3-token prompts (one 4-token block each), about to decode."""
    config = EngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=budget)
    s = Scheduler(config, BlockManager(num_blocks, 4, caching=False))
    reqs = [Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=20), seed=0) for i in "ab"]
    for req in reqs:
        s.add(req)
    batch = s.schedule()
    s.advance(batch)
    s.resolve(batch, {i: (7, None) for i in batch.sampling_indices})
    return s, *reqs


def test_the_scheduler_trims_drafts_to_the_budget_and_the_spare_blocks():
    """Drafts fit in what is left of the step's budget and in the free blocks beyond one per
    running request; what does not fit is dropped, never preempting anyone."""
    s, a, b = _two_decodes(num_blocks=8, budget=8)
    a.spec_tokens, b.spec_tokens = list(range(9)), [5, 6]
    batch = s.schedule()
    # the budget: a takes 1 + 6 tokens, leaving b its last token (a plain decode, first)
    assert batch.requests == [b, a] and batch.num_new_tokens == [1, 7]
    assert (a.spec_tokens, b.spec_tokens) == (list(range(6)), [])
    assert batch.sampling_indices == [0, 1] and batch.num_decodes == 1
    assert len(a.block_table) == 3  # positions 3..9

    s, a, b = _two_decodes(num_blocks=5, budget=64)
    a.spec_tokens, b.spec_tokens = list(range(9)), list(range(9))
    batch = s.schedule()
    # 3 free blocks, 2 kept back for the running requests: a's block and 1 more hold
    # positions 3..7 (1 + 4 tokens); then 0 spare: b fills its own block (1 + 0)
    assert (a.spec_tokens, b.spec_tokens) == (list(range(4)), [])
    assert batch.num_new_tokens == [1, 5] and s.num_preemptions == 0
    assert s.block_manager.num_free_blocks == 2


# --- the adaptive k (engine/spec/draft_length.py, measured by engine/spec/measure.py) -------------
def _flat(batch: int, k: int) -> float:
    """A weight-bound step: the same time at every k, so drafting pays from a modest rate."""
    return 1e-3


def _proportional(batch: int, k: int) -> float:
    """A compute-bound step: k + 1 tokens a sequence cost k + 1 times one; drafting never
    pays (at best it breaks even, at acceptance 1, and ties keep k = 0)."""
    return 1e-3 * (k + 1)


def _table(cost) -> CostTable:
    return CostTable(
        {(b, k): cost(b, k) for b in (1, 4) for k in range(MAX_SPECULATIVE_TOKENS + 1)}
    )


def _adaptive(folder, cost=None) -> LLM:
    """Adaptive k on the measured step costs, or on `cost`'s table (injected after start-up)."""
    llm = _spec(folder)
    assert llm.engine.spec.policy is not None  # measured at start-up
    if cost is not None:
        llm.engine.spec.use_costs(_table(cost))
    return llm


def test_adaptive_k_gives_the_same_tokens_greedy_and_seeded(tiny_llama, plain):
    for cost in (None, _flat):  # the CPU's measured costs, then a table where drafting pays
        llm = _adaptive(tiny_llama, cost)
        outs = llm.generate(_prompts(), GREEDY)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
        _assert_all_returned(llm)
    c = llm.engine.spec.counters
    assert 0 < c.num_accepted_tokens < c.num_draft_tokens
    stats = llm.engine.stats()["spec_decode"]
    assert stats["k"] == llm.engine.spec.last_k
    assert 1 <= stats["k"] <= MAX_SPECULATIVE_TOKENS  # the policy's last choice: drafting
    off = LLM(str(tiny_llama), device="cpu").generate(_prompts(), SEEDED)
    llm = _adaptive(tiny_llama, _flat)
    on = llm.generate(_prompts(), SEEDED)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert llm.engine.spec.counters.num_accepted_tokens > 0


def test_no_drafts_where_drafting_never_pays(tiny_llama, plain):
    llm = _adaptive(tiny_llama, _proportional)
    outs = llm.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert llm.engine.spec.counters.num_draft_tokens == 0
    assert llm.engine.stats()["spec_decode"]["k"] == 0
    assert llm.engine.spec.policy.step > 0  # it was asked, and chose k = 0


class WrongDrafter(Drafter):
    """Drafts a token the greedy run does not take: every draft is rejected. Counts the
    proposals per request."""

    name = "wrong"

    def __init__(self, reference: list[int]) -> None:
        self.reference = reference
        self.proposals = 0

    def propose(self, requests, k):
        drafts = []
        for req, num in zip(requests, per_request_k(requests, k)):
            known = len(req.token_ids) - req.num_pending
            self.proposals += bool(num)
            drafts.append(Draft([(self.reference[known] + 1) % 256] * num))
        return drafts


def test_a_request_whose_drafts_keep_failing_stops_drafting(tiny_llama, plain):
    llm = _adaptive(tiny_llama, _flat)
    wrong = WrongDrafter(_prompts()[0] + plain[0].token_ids)
    llm.engine.spec.drafter = wrong
    out = llm.generate(_prompts()[:1], GREEDY)[0]
    assert out.token_ids == plain[0].token_ids
    c = llm.engine.spec.counters
    assert c.num_accepted_tokens == 0 and c.num_drafts == wrong.proposals
    # of its NEW_TOKENS - 1 decode steps, the first few draft (each rejected) until its rate,
    # from the policy's first guess, is below the floor (after at least min_updates); then it
    # drafts no more
    policy = llm.engine.spec.policy
    rate = Acceptance(policy.decay, policy.probe_rate, policy.prior_weight)
    while rate.num_updates < policy.min_updates or rate.rate >= policy.floor:
        rate.update(1, 0)
    assert wrong.proposals == rate.num_updates < NEW_TOKENS - 1
