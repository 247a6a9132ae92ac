"""Scheduler policy: the step's token budget, fixed or adapting to the queue."""

from __future__ import annotations

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.request import Request
from engine.sampling_params import SamplingParams


def _scheduler(**kw):
    from engine.scheduler import Scheduler

    cfg = EngineConfig(max_num_seqs=8, max_num_batched_tokens=2048, **kw)
    return Scheduler(cfg, BlockManager(1024, 16))


def _queue(scheduler, n: int, prompt_len: int = 300) -> None:
    for i in range(n):
        scheduler.add(Request(f"r{i}", list(range(prompt_len)), SamplingParams(), seed=i))


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
