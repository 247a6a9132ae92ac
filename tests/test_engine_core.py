"""The engine core process and its client: streaming deltas back as cumulative outputs, errors
before any output, abort freeing KV blocks in the core, several front ends on one core, a
front end that goes away, an idle core that sleeps, a crash, and shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.core.core_client import CoreClient
from engine.core.loop import IDLE_POLL_MS
from engine.core.process import start_core
from engine.core.stream import EngineDeadError
from engine.sampling_params import SamplingParams
from tests.support.fake_engine import CRASH_MARK, STALL_MARK, FakeEngine
from tests.support.waiting import wait_until


@pytest.fixture
def core():
    started = start_core(FakeEngine(step_time=0.005))
    yield started
    if started.process.is_alive():
        started.process.kill()
    started.join(5)


@pytest.fixture
async def client(core):
    c = CoreClient(core.address, core.info.stats)
    await c.start()
    yield c
    await c.close(shutdown_core=True)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


async def collect(c: CoreClient, rid: str, prompt, params):
    return [out async for out in c.generate(rid, prompt, params)]


async def test_streams_cumulative_outputs_to_the_end(core, client):
    assert core.info.model_name == "fake-model" and core.info.config.max_model_len == 128
    outs = await collect(client, "a", "w10 w11", greedy(5))
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert len(outs[-1].token_ids) == 5 and outs[-1].prompt_token_ids == [10, 11]
    assert outs[-1].text == core.info.tokenizer.decode(outs[-1].token_ids)
    lengths = [len(o.token_ids) for o in outs]
    assert lengths == sorted(lengths)  # cumulative, never going back
    assert client.stats()["num_unfinished"] == 0


async def test_logprobs_stop_strings_and_traces_cross_intact(client):
    full = (await collect(client, "f", [30], greedy(6, logprobs=2, seed=1)))[-1]
    assert len(full.logprobs) == 6 and all(len(lp.top) == 2 for lp in full.logprobs)
    assert full.trace and full.trace[-1].event == "finished"
    stop = full.text.split()[3]
    cut = (await collect(client, "s", [30], greedy(6, stop=[f" {stop}"], seed=1)))[-1]
    assert cut.text == " " + " ".join(full.text.split()[:3])
    assert cut.finish_reason == "stop" and cut.stop_reason == f" {stop}"


async def test_concurrent_requests_each_get_their_own_tokens(client):
    results = await asyncio.gather(
        *(collect(client, f"r{i}", f"w{20 + i}", greedy(4)) for i in range(8))
    )
    finals = [r[-1] for r in results]
    assert [f.request_id for f in finals] == [f"r{i}" for i in range(8)]
    assert len({tuple(f.token_ids) for f in finals}) == 8  # different prompts, different outputs


async def test_bad_request_raises_before_any_output(client):
    gen = client.generate("long", "w1 " * 10, greedy(1000))
    with pytest.raises(ValueError, match="context length"):
        await gen.__anext__()
    with pytest.raises(ValueError, match="empty"):
        await client.add_request("empty", [], greedy(2))
    assert client.stats()["num_unfinished"] == 0


async def test_abort_frees_kv_blocks_in_the_core(client):
    stream = await client.add_request("stall", f"w{STALL_MARK} w9", greedy(50))
    first = await stream.next()
    assert len(first.token_ids) == 1
    await wait_until(lambda: client.stats()["kv_blocks_used"] > 0)

    async def consume():
        async for _ in client.generate("s2", f"w{STALL_MARK} w8", greedy(50)):
            pass

    task = asyncio.create_task(consume())
    await wait_until(lambda: client.stats()["num_unfinished"] == 2)  # s2 is in the core
    task.cancel()
    client.abort("stall")
    with pytest.raises(asyncio.CancelledError):
        await task
    final = await stream.next()
    assert final.finished and final.finish_reason == "abort"
    await wait_until(lambda: client.stats()["kv_blocks_used"] == 0)
    assert client.stats()["num_unfinished"] == 0


async def test_two_front_ends_share_one_core_and_a_departed_one_frees_its_blocks(core, client):
    other = CoreClient(core.address, core.info.stats)
    await other.start()
    stalled = await other.add_request("theirs", f"w{STALL_MARK} w2", greedy(50))
    await stalled.next()
    mine = await collect(client, "mine", "w5", greedy(3))
    assert mine[-1].finished and not stalled.finished
    same = await asyncio.gather(  # one id from two front ends: two requests in the core
        collect(client, "same", "w7", greedy(2)), collect(other, "same", "w8", greedy(2))
    )
    assert [outs[-1].finish_reason for outs in same] == ["length", "length"]
    assert client.stats()["num_unfinished"] == 1  # the core counts every front end's requests
    await other.close()  # gone without aborting: the core aborts its requests
    await collect(client, "poke", "w6", greedy(2))  # a step, so the core notices
    await wait_until(lambda: client.stats()["kv_blocks_used"] == 0)


class LoopCountingEngine(FakeEngine):
    """The fake engine, also reporting how often the core loop asked it for work (once a loop
    iteration)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.num_work_checks = 0

    def has_unfinished(self) -> bool:
        self.num_work_checks += 1
        return super().has_unfinished()

    def stats(self) -> dict:
        return {**super().stats(), "num_work_checks": self.num_work_checks}


async def test_idle_core_sleeps():
    core = start_core(LoopCountingEngine(step_time=0.005))
    client = CoreClient(core.address, core.info.stats)
    await client.start()
    try:
        await collect(client, "x", "w7", greedy(2))
        before, start = client.stats()["num_work_checks"], time.monotonic()
        await asyncio.sleep(0.5)
        await collect(client, "y", "w7", greedy(2))  # its frames carry the count
        checks = client.stats()["num_work_checks"] - before
        # one check per IDLE_POLL_MS asleep, a few for the request; a spinning loop makes
        # thousands
        asleep = (time.monotonic() - start) / (IDLE_POLL_MS / 1000)
        assert checks <= asleep + 20, f"{checks} loop iterations in {asleep:.0f} idle polls"
    finally:
        await client.close(shutdown_core=True)
        if core.process.is_alive():
            core.process.kill()
        core.join(5)


async def test_engine_crash_fails_streams_and_new_requests(client):
    stream = await client.add_request("c", "w9", greedy(100))
    await stream.next()
    with pytest.raises(EngineDeadError, match="simulated"):
        await collect(client, "boom", f"w{CRASH_MARK}", greedy(2))
    with pytest.raises(EngineDeadError, match="simulated"):
        while True:
            await stream.next()
    with pytest.raises(EngineDeadError):
        await client.add_request("d", "w9", greedy(2))
    assert not client.is_running


async def test_shutdown_stops_the_core_at_once(core, client):
    stream = await client.add_request("s", f"w{STALL_MARK} w1", greedy(50))
    await stream.next()
    start = time.monotonic()
    await client.close(shutdown_core=True)
    await asyncio.get_running_loop().run_in_executor(None, core.join, 5.0)
    assert time.monotonic() - start < 2 and core.exitcode == 0
    with pytest.raises(EngineDeadError):
        await stream.next()
