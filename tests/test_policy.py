"""The scheduling policy (engine.scheduling.scheduling_policy): the waiting order (aging, class,
fair share, short first), the preemption victim, the long-prompt share of a step, and the scheduler
applying them (a real BlockManager and Requests, no model, a fake clock)."""

from __future__ import annotations

from itertools import count

import pytest

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.request import Request
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.scheduling_policy import FairShare, SchedulingPolicy

_token_ids = count(1000)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _request(name: str, prompt_len: int, clock: Clock, priority="interactive", client=None):
    params = SamplingParams(max_tokens=2, priority=priority, client=client)
    return Request(name, list(range(1, prompt_len + 1)), params, 0, arrival_time=clock.now)


def _policy(**kw) -> tuple[SchedulingPolicy, Clock]:
    clock = Clock()
    return SchedulingPolicy(EngineConfig(**kw), clock), clock


def _names(reqs) -> list[str]:
    return [r.request_id for r in reqs]


# --- order ---------------------------------------------------------------------------------------
def test_interactive_ranks_before_batch_whatever_the_arrival():
    policy, clock = _policy()
    b = _request("b", 10, clock, priority="batch")
    clock.now += 1
    i = _request("i", 10, clock)
    assert _names(policy.order([b, i], budget=64)) == ["i", "b"]


def test_the_client_with_fewer_recent_tokens_goes_first_and_usage_decays():
    policy, clock = _policy(fair_share_window_s=60.0)
    heavy = [_request(f"h{k}", 10, clock, client="heavy") for k in range(2)]
    light = _request("l", 10, clock, client="light")
    policy.charge(heavy[0], 500)
    assert _names(policy.order([*heavy, light], budget=64)) == ["l", "h0", "h1"]
    policy.charge(light, 100)
    assert _names(policy.order([*heavy, light], budget=64)) == ["l", "h0", "h1"]
    policy.charge(light, 500)  # now light has served more
    assert _names(policy.order([*heavy, light], budget=64)) == ["h0", "h1", "l"]


def test_a_client_of_weight_two_is_served_as_if_it_had_used_half():
    policy, clock = _policy(fair_share_window_s=60.0)

    def weighted(name, client, weight):
        params = SamplingParams(max_tokens=2, client=client, share_weight=weight)
        return Request(name, [1, 2, 3], params, 0, arrival_time=clock.now)

    light, heavy = weighted("l", "light", 1.0), weighted("h", "heavy", 2.0)
    policy.charge(light, 300)
    policy.charge(heavy, 500)  # 500 / 2 = 250 < 300
    assert _names(policy.order([light, heavy], budget=64)) == ["h", "l"]
    policy.charge(heavy, 200)  # 700 / 2 = 350 > 300
    assert _names(policy.order([light, heavy], budget=64)) == ["l", "h"]
    with pytest.raises(ValueError, match="share_weight must be a positive number"):
        SamplingParams(share_weight=0)


def test_fair_share_decays_by_e_per_window():
    share = FairShare(window_s=60.0)
    share.charge("a", 1000, now=0.0)
    assert share.usage("a", 0.0) == 1000
    assert share.usage("a", 60.0) == pytest.approx(1000 / 2.718281828, rel=1e-6)
    share.charge("a", 100, now=60.0)
    assert share.usage("a", 120.0) == pytest.approx((1000 / 2.718281828 + 100) / 2.718281828)
    assert share.usage("nobody", 5.0) == 0.0


def test_short_prompts_go_before_long_ones_within_a_class_and_keep_arrival_order():
    policy, clock = _policy(long_prompt_share=0.5)
    reqs = [_request("long1", 40, clock), _request("s1", 32, clock), _request("long2", 33, clock)]
    reqs.append(_request("s2", 5, clock))
    # budget 64: long means more than 32 tokens left
    assert _names(policy.order(reqs, budget=64)) == ["s1", "s2", "long1", "long2"]
    # but the class comes first: a short batch request waits behind a long interactive one
    batch = _request("sb", 4, clock, priority="batch")
    assert _names(policy.order([batch, *reqs], budget=64))[-1] == "sb"


def test_long_prompt_tokens_sets_the_threshold():
    policy, clock = _policy(long_prompt_tokens=8)
    a, b = _request("a", 9, clock), _request("b", 8, clock)
    assert policy.is_long(a, 1000) and not policy.is_long(b, 1000)
    assert _names(policy.order([a, b], budget=1000)) == ["b", "a"]


def test_a_preempted_request_ranks_first_in_its_class_but_not_above_a_higher_class():
    policy, clock = _policy()
    fresh = _request("fresh", 4, clock, client="light")
    back = _request("back", 100, clock, client="heavy")
    back.metrics.num_preemptions = 1
    policy.charge(back, 10_000)
    assert _names(policy.order([fresh, back], budget=64)) == ["back", "fresh"]
    back_batch = _request("back_batch", 4, clock, priority="batch")
    back_batch.metrics.num_preemptions = 1
    assert _names(policy.order([back_batch, fresh], budget=64)) == ["fresh", "back_batch"]


def test_aging_puts_the_oldest_aged_request_ahead_of_everything_younger_one_at_a_time():
    policy, clock = _policy(queue_aging_s=10.0)
    old = _request("old_batch_long", 500, clock, priority="batch", client="heavy")
    policy.charge(old, 10_000)
    clock.now += 5
    older_aged = _request("second", 600, clock, priority="batch")
    clock.now += 4
    young = _request("young", 4, clock)
    assert _names(policy.order([young, older_aged, old], budget=64))[0] == "young"
    clock.now += 1  # old has waited 10 s
    assert _names(policy.order([young, older_aged, old], budget=64)) == [
        "old_batch_long",
        "young",
        "second",
    ]
    clock.now += 5  # both aged: only the oldest goes ahead of the young interactive one
    assert _names(policy.order([young, older_aged, old], budget=64)) == [
        "old_batch_long",
        "young",
        "second",
    ]
    assert _names(policy.order([young, older_aged], budget=64)) == ["second", "young"]


# --- preemption ----------------------------------------------------------------------------------
def test_the_victim_is_the_newest_batch_request_then_the_newest_interactive_one():
    policy, clock = _policy()
    b1, i1, b2, i2 = (
        _request(n, 4, clock, priority=p)
        for n, p in (("b1", "batch"), ("i1", "interactive"), ("b2", "batch"), ("i2", "interactive"))
    )
    me = _request("me", 4, clock)
    assert policy.victim(me, [b1, i1, b2, i2]).request_id == "b2"
    assert policy.victim(me, [b1, i1, i2]).request_id == "b1"
    assert policy.victim(me, [i1, i2]).request_id == "i2"
    assert policy.victim(me, []) is me
    # a batch request never preempts an interactive one: it gives up its own blocks
    mine = _request("mine", 4, clock, priority="batch")
    assert policy.victim(mine, [i1, i2]) is mine
    assert policy.victim(mine, [b1, i1]).request_id == "b1"


# --- the scheduler applying the policy -----------------------------------------------------------
def _scheduler(num_blocks=64, block_size=4, **kw) -> tuple[Scheduler, Clock]:
    clock = Clock()
    cfg = EngineConfig(block_size=block_size, **{"max_num_seqs": 8, **kw})
    return Scheduler(cfg, BlockManager(num_blocks, block_size, caching=False), clock), clock


def _plan(batch) -> list[tuple[str, int]]:
    return [(r.request_id, n) for r, n in zip(batch.requests, batch.num_new_tokens)]


def _step(s: Scheduler):
    batch = s.schedule()
    sampled = {i: (next(_token_ids), None) for i in batch.sampling_indices}
    s.advance(batch)
    s.resolve(batch, sampled)
    return batch


def test_a_long_prompt_takes_the_whole_budget_alone_and_its_share_while_a_short_one_waits():
    s, clock = _scheduler(max_num_batched_tokens=16, long_prompt_share=0.5)
    long = _request("long", 64, clock, priority="batch")
    s.add(long)
    assert _plan(_step(s)) == [("long", 16)]  # alone: the whole budget
    s.add(_request("short", 6, clock))
    assert _plan(_step(s)) == [("long", 8), ("short", 6)]  # a short one waits: half the budget
    assert _plan(_step(s)) == [("short", 1), ("long", 15)]  # nobody waits: all that is left


def test_a_waiting_long_prompt_is_not_admitted_once_the_long_share_is_spent():
    s, clock = _scheduler(max_num_batched_tokens=16, long_prompt_share=0.5)
    for name in ("l1", "l2"):
        s.add(_request(name, 40, clock))
    _step(s)
    s.add(_request("short", 3, clock))
    plan = _plan(_step(s))
    assert plan == [("l1", 8), ("short", 3)]  # l2 is not admitted: the long share is spent
    assert _plan(_step(s)) == [("short", 1), ("l1", 15)]  # the cap is off: l1 runs on


def test_a_request_that_does_not_fit_is_passed_by_a_smaller_one_unless_aged():
    s, clock = _scheduler(num_blocks=6, max_num_batched_tokens=64, queue_aging_s=10.0)
    hog = _request("hog", 16, clock)  # 4 of the 6 blocks
    s.add(hog)
    _step(s)
    big, small = _request("big", 12, clock), _request("small", 4, clock)
    s.add(big)  # needs 3 blocks, 2 are free
    s.add(small)
    assert _plan(_step(s)) == [("hog", 1), ("small", 4)]  # small passes big
    assert list(s.waiting) == [big]
    s2, clock2 = _scheduler(num_blocks=6, max_num_batched_tokens=64, queue_aging_s=10.0)
    hog = _request("hog", 16, clock2)
    s2.add(hog)
    _step(s2)
    big, small = _request("big", 12, clock2), _request("small", 4, clock2)
    s2.add(big)
    s2.add(small)
    clock2.now += 10  # big is aged (small too, but arrived after it): nobody passes big
    assert _plan(_step(s2)) == [("hog", 1)]
    assert list(s2.waiting) == [big, small]
    while big in s2.waiting:  # hog finishes: big goes first, its trace says it was aged
        _step(s2)
    assert [e.event for e in big.trace].count("aged") == 1


def test_kv_pressure_preempts_the_batch_request_not_the_interactive_one():
    # three requests of one block each fill the pool; each decode then needs a second block
    s, _ = _scheduler(num_blocks=4, max_num_batched_tokens=64)
    clock = s.policy.clock
    reqs = [
        _request("i1", 4, clock),
        _request("b1", 4, clock, priority="batch"),
        _request("i2", 4, clock),
        _request("i3", 4, clock),
    ]
    for r in reqs:
        s.add(r)
    _step(s)
    assert s.block_manager.num_free_blocks == 0
    batch = _step(s)
    # i1 takes b1's block (the batch one, though i3 is newer); i2 then takes i3's
    assert batch.preempted == [reqs[1], reqs[3]]
    assert _plan(batch) == [("i1", 1), ("i2", 1)]


def test_scheduled_tokens_count_against_the_client():
    s, clock = _scheduler(max_num_batched_tokens=64)
    s.add(_request("a", 10, clock, client="alice"))
    s.add(_request("b", 20, clock, client="bob"))
    _step(s)
    share = s.policy.fair_share
    assert share.usage("alice", clock.now) == 10 and share.usage("bob", clock.now) == 20


def test_no_long_share_while_the_waiting_short_request_has_no_seat():
    s, clock = _scheduler(max_num_batched_tokens=16, max_num_seqs=1)
    s.add(_request("long", 64, clock))
    _step(s)
    s.add(_request("short", 4, clock))
    assert _plan(_step(s)) == [("long", 16)]  # no seat for short: the long prompt runs on
