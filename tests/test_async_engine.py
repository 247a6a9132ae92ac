"""AsyncEngine: thread-safe submission, streaming to the right loop, abort on cancel, no spin."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine.async_engine import AsyncEngine, EngineDeadError
from engine.sampling_params import SamplingParams
from tests.support.fake_engine import STALL_MARK, FakeEngine


@pytest.fixture
def engine():
    fake = FakeEngine()
    ae = AsyncEngine(fake)
    ae.start()
    yield ae
    ae.shutdown()


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


async def collect(ae: AsyncEngine, rid: str, prompt, params):
    return [out async for out in ae.generate(rid, prompt, params)]


async def test_streams_cumulative_outputs_to_the_end(engine):
    outs = await collect(engine, "a", "w10 w11", greedy(5))
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert len(outs[-1].token_ids) == 5
    lengths = [len(o.token_ids) for o in outs]
    assert lengths == sorted(lengths)  # cumulative, never going back
    assert engine.stats()["num_unfinished"] == 0


async def test_concurrent_requests_each_get_their_own_tokens(engine):
    results = await asyncio.gather(
        *(collect(engine, f"r{i}", f"w{20 + i}", greedy(4)) for i in range(8))
    )
    finals = [r[-1] for r in results]
    assert [f.request_id for f in finals] == [f"r{i}" for i in range(8)]
    assert len({tuple(f.token_ids) for f in finals}) == 8  # different prompts, different outputs


async def test_bad_request_raises_before_any_output(engine):
    gen = engine.generate("long", "w1 " * 10, greedy(1000))
    with pytest.raises(ValueError, match="context length"):
        await gen.__anext__()
    with pytest.raises(ValueError, match="empty"):
        await engine.add_request("empty", [], greedy(2))
    assert engine.stats()["num_unfinished"] == 0


async def test_cancelling_the_consumer_aborts_and_frees_blocks(engine):
    stream = await engine.add_request("stall", f"w{STALL_MARK} w9", greedy(50))
    first = await stream.next()
    assert len(first.token_ids) == 1
    await asyncio.sleep(0.05)
    assert engine.stats()["kv_blocks_used"] > 0

    async def consume():
        async for _ in engine.generate("s2", f"w{STALL_MARK} w8", greedy(50)):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    engine.abort("stall")
    with pytest.raises(asyncio.CancelledError):
        await task
    final = await stream.next()
    assert final.finished and final.finish_reason == "abort"
    for _ in range(100):
        if engine.stats()["kv_blocks_used"] == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.stats()["kv_blocks_used"] == 0
    assert engine.stats()["num_unfinished"] == 0


async def test_submissions_from_another_thread_and_loop(engine):
    result = {}

    def other_thread():
        result["outs"] = asyncio.run(collect(engine, "t", "w5", greedy(3)))

    thread = threading.Thread(target=other_thread)
    thread.start()
    mine = await collect(engine, "m", "w6", greedy(3))
    await asyncio.get_running_loop().run_in_executor(None, thread.join)
    assert result["outs"][-1].finished and mine[-1].finished


async def test_idle_engine_thread_sleeps():
    fake = FakeEngine()
    calls = 0
    original = fake.has_unfinished

    def counting():
        nonlocal calls
        calls += 1
        return original()

    fake.has_unfinished = counting
    ae = AsyncEngine(fake)
    ae.start()
    try:
        await collect(ae, "x", "w7", greedy(2))
        before = calls
        await asyncio.sleep(0.3)
        assert calls - before <= 1  # a spinning loop would call it thousands of times
    finally:
        ae.shutdown()


async def test_engine_crash_fails_streams_and_new_requests():
    fake = FakeEngine(step_time=0.01)
    ae = AsyncEngine(fake)
    ae.start()
    try:
        stream = await ae.add_request("c", "w9", greedy(100))
        await stream.next()
        fake.crash_next_step = True
        with pytest.raises(EngineDeadError, match="simulated"):
            while True:
                await stream.next()
        with pytest.raises(EngineDeadError):
            await ae.add_request("d", "w9", greedy(2))
        assert not ae.is_running
    finally:
        ae.shutdown()


async def test_shutdown_aborts_in_flight_requests():
    ae = AsyncEngine(FakeEngine())
    ae.start()
    stream = await ae.add_request("s", f"w{STALL_MARK} w1", greedy(50))
    await stream.next()
    start = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, ae.shutdown)
    assert time.monotonic() - start < 2
    final = await stream.next()
    assert final.finished and final.finish_reason == "abort"
