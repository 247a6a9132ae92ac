"""Scheduler policy, driven directly (a real BlockManager and Requests, no model): decode-first
order, the token budget and sequence cap, chunked prefill, the preemption victim and what
preemption does to a request, freeing blocks, and the adaptive token budget."""

from __future__ import annotations

from itertools import count

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.request import Request, RequestStatus
from engine.scheduling.scheduler import ScheduledBatch, Scheduler

_token_ids = count(1000)


def _scheduler(num_blocks: int = 1024, block_size: int = 16, **kw) -> Scheduler:
    kw = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, **kw}
    cfg = EngineConfig(block_size=block_size, **kw)
    # The prompts here repeat token ids: the prefix cache is off, so the policy is what shows
    # (tests/test_prefix_cache.py schedules with it on).
    return Scheduler(cfg, BlockManager(num_blocks, block_size, caching=False))


def _small(num_blocks: int = 64, **kw) -> Scheduler:
    """Blocks of 4 tokens, so a few tokens cross a block boundary."""
    return _scheduler(num_blocks, 4, **kw)


def _request(request_id: str, prompt_len: int, max_tokens: int = 16) -> Request:
    params = SamplingParams(max_tokens=max_tokens)
    return Request(request_id, list(range(1, prompt_len + 1)), params, seed=0)


def _queue(scheduler, n: int, prompt_len: int = 300) -> None:
    for i in range(n):
        scheduler.add(Request(f"r{i}", list(range(prompt_len)), SamplingParams(), seed=i))


def _step(s: Scheduler) -> ScheduledBatch:
    """One engine step without a model: schedule, launch (advance), and the sampled tokens
    come back (resolve), each a fresh id so that outputs can be told apart."""
    batch = s.schedule()
    sampled = {i: (next(_token_ids), None) for i in batch.sampling_indices}
    s.advance(batch)
    s.resolve(batch, sampled)
    return batch


def _plan(batch: ScheduledBatch) -> list[tuple[str, int]]:
    return [(r.request_id, n) for r, n in zip(batch.requests, batch.num_new_tokens)]


# --- order and caps ----------------------------------------------------------------------------
def test_decodes_come_before_running_prefills_and_those_before_admissions():
    s = _small(max_num_batched_tokens=8)
    a, b, c = _request("a", 3), _request("b", 30), _request("c", 10)
    s.add(a)
    assert _plan(_step(s)) == [("a", 3)]  # a's whole prompt; a decodes from now on
    s.add(b)
    assert _plan(_step(s)) == [("a", 1), ("b", 7)]  # the decode first, b gets what is left
    s.add(c)
    batch = s.schedule()
    # the budget is spent by a's decode and b's next chunk: c, waiting, gets nothing
    assert _plan(batch) == [("a", 1), ("b", 7)] and batch.num_decodes == 1
    assert list(s.waiting) == [c] and c.block_table == [] and s.running == [a, b]


def test_max_num_seqs_caps_the_running_requests():
    s = _small(max_num_seqs=2)
    reqs = [_request(f"r{i}", 10, max_tokens=2) for i in range(4)]
    for r in reqs:
        s.add(r)
    assert _plan(_step(s)) == [("r0", 10), ("r1", 10)]
    assert s.running == reqs[:2] and list(s.waiting) == reqs[2:]
    assert _plan(_step(s)) == [("r0", 1), ("r1", 1)]  # budget left, but no free seat
    assert all(r.is_finished for r in reqs[:2]) and s.running == []
    assert _plan(_step(s)) == [("r2", 10), ("r3", 10)]  # seats freed by the finished two


def test_token_budget_caps_the_step_and_cuts_the_last_admission_to_a_chunk():
    s = _small(max_num_batched_tokens=25)
    reqs = [_request(f"r{i}", 10) for i in range(4)]
    for r in reqs:
        s.add(r)
    batch = _step(s)
    assert _plan(batch) == [("r0", 10), ("r1", 10), ("r2", 5)]
    assert batch.sampling_indices == [0, 1]  # r2 has not reached the end of its prompt
    assert list(s.waiting) == [reqs[3]] and reqs[2].num_computed_tokens == 5
    s.config.max_num_batched_tokens = 3
    batch = s.schedule()
    # two decodes, then one token of r2's prompt: a 1-token chunk, neither decode nor sampling
    assert _plan(batch) == [("r0", 1), ("r1", 1), ("r2", 1)]
    assert batch.num_decodes == 2 and batch.sampling_indices == [0, 1]
    s.config.max_num_batched_tokens = 1
    s.advance(batch)
    assert _plan(s.schedule()) == [("r0", 1)]  # the budget stops the decodes too


def test_a_long_prompt_is_prefilled_in_budget_sized_chunks_and_only_the_last_samples():
    s = _small(max_num_batched_tokens=8)
    req = _request("long", 20, max_tokens=3)
    s.add(req)
    chunks, sampling, computed, blocks = [], [], [], []
    for _ in range(4):
        batch = _step(s)
        chunks += batch.num_new_tokens
        sampling.append(batch.sampling_indices)
        computed.append(req.num_computed_tokens)
        blocks.append(len(req.block_table))
    assert chunks == [8, 8, 4, 1]  # three prompt chunks, then a decode
    assert sampling == [[], [], [0], [0]]
    assert computed == [8, 16, 20, 21]
    assert blocks == [2, 4, 5, 6]  # blocks are taken as the chunks need them
    assert req.metrics.num_prefill_chunks == 3 and req.num_output_tokens == 2
    _step(s)
    assert req.is_finished and s.block_manager.num_free_blocks == 64


# --- preemption --------------------------------------------------------------------------------
def test_preemption_takes_the_newest_unscheduled_request_else_the_request_itself():
    # a, b, c fill one block each and the pool; each one's decode then needs a second block
    s = _small(num_blocks=3, max_num_seqs=3)
    a, b, c, d = (_request(name, 4) for name in "abcd")
    for r in (a, b, c, d):
        s.add(r)
    _step(s)
    assert s.running == [a, b, c] and list(s.waiting) == [d]
    assert s.block_manager.num_free_blocks == 0
    tokens = {r.request_id: list(r.token_ids) for r in (b, c)}
    batch = _step(s)
    # a's block comes from c (newest, not scheduled); for b only a is left, and a is
    # scheduled, so b preempts itself
    assert batch.preempted == [c, b] and _plan(batch) == [("a", 1)]
    assert list(s.waiting) == [b, c, d]  # back at the head of the queue, ahead of d
    assert s.running == [a] and s.num_preemptions == 2
    for r in (b, c):
        assert r.status is RequestStatus.WAITING and r.num_computed_tokens == 0
        assert r.block_table == [] and r.metrics.num_preemptions == 1
        assert r.token_ids == tokens[r.request_id]  # its sampled token is kept
    assert s.block_manager.num_free_blocks == 1  # a holds 2 of the 3 blocks


def test_a_preempting_step_admits_nobody_and_the_victim_re_prefills_prompt_and_output():
    s = _small(num_blocks=4)
    a, c = _request("a", 4, max_tokens=2), _request("c", 12, max_tokens=2)
    s.add(a)
    s.add(c)
    _step(s)  # a holds 1 block, c 3: the pool is full
    assert s.block_manager.num_free_blocks == 0
    first_token = c.output_token_ids
    s.config.max_num_batched_tokens = 3
    batch = _step(s)
    assert batch.preempted == [c] and _plan(batch) == [("a", 1)]
    # 2 blocks and 2 tokens of budget are left, enough for a chunk of c: still not admitted
    assert list(s.waiting) == [c] and c.block_table == []
    assert a.is_finished and s.running == []
    plans, sampling = [], []
    while s.num_unfinished:
        batch = _step(s)
        plans.append(_plan(batch))
        sampling.append(batch.sampling_indices)
    # c recomputes its 12 prompt tokens and the token it had sampled, then samples the next
    assert plans == [[("c", 3)]] * 4 + [[("c", 1)]]
    assert sampling == [[]] * 4 + [[0]]
    assert c.output_token_ids[:1] == first_token and c.num_output_tokens == 2
    assert s.block_manager.num_free_blocks == 4


# --- freeing -----------------------------------------------------------------------------------
def test_finish_and_abort_free_blocks_and_leave_the_queues():
    s = _small(num_blocks=16, max_num_seqs=2)
    a, b, w = _request("a", 10, max_tokens=1), _request("b", 10), _request("w", 5)
    for r in (a, b, w):
        s.add(r)
    batch = s.schedule()
    s.advance(batch)  # launched: a's and b's tokens are on their way
    assert s.block_manager.num_free_blocks == 16 - 3 - 3 and list(s.waiting) == [w]
    s.finish(b, RequestStatus.FINISHED_ABORTED)
    s.finish(w, RequestStatus.FINISHED_ABORTED)
    assert b.block_table == [] and s.running == [a] and not s.waiting
    assert s.block_manager.num_free_blocks == 16 - 3
    touched = s.resolve(batch, {0: (7, None), 1: (8, None)})
    assert touched == [a] and a.finish_reason == "length" and a.block_table == []
    assert b.output_token_ids == [] and b.finish_reason == "abort"  # its token came too late
    assert s.num_unfinished == 0 and s.block_manager.num_free_blocks == 16


# --- adaptive token budget ---------------------------------------------------------------------
def test_fixed_budget_by_default():
    s = _scheduler()
    assert s.token_budget() == 2048
    _queue(s, 20)
    assert s.token_budget() == 2048


def test_adaptive_budget_grows_with_the_queue_and_bounds_each_step():
    s = _scheduler(adaptive_batching=True, min_num_batched_tokens=256)
    assert s.token_budget() == 256  # nobody waiting
    budgets = []
    for _ in range(8):
        _queue(s, 1)
        budgets.append(s.token_budget())
    assert budgets == sorted(budgets) and budgets[-1] == 2048  # 8 waiting = max_num_seqs
    _queue(s, 10)
    assert s.token_budget() == 2048  # capped
    batch = s.schedule()
    assert batch.num_tokens <= 2048


def test_adaptive_short_queue_takes_small_steps():
    s = _scheduler(adaptive_batching=True, min_num_batched_tokens=256)
    _queue(s, 1, prompt_len=1000)
    budget = s.token_budget()
    assert budget < 2048
    assert s.schedule().num_tokens == budget  # the long prompt is chunked at the small budget
