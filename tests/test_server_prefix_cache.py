"""What the front end shows of the prefix cache, on the fake engine: usage's
prompt_tokens_details.cached_tokens on both endpoints (plain and the stream's usage chunk, per
prompt for n > 1 and several prompts), the cached tokens of /v1/stats rows and
/v1/requests/{id}, the engine's prefix_cache_hit trace event, the vllm:prefix_cache_* counters
and /v1/stats' hit rate over the last minute and cached blocks."""

from __future__ import annotations

import asyncio
import re

import pytest

from appliance.server.records import ChoiceRecord, RequestRecord
from appliance.server.responses import usage
from appliance.server.schema.responses import CompletionChunk, CompletionResponse
from appliance.server.stats import PREFIX_CACHE_WINDOW_S, StatsTracker
from engine.scheduling.request import RequestMetrics, RequestOutput
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client, sse_events

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PROMPT = " ".join(f"w{i}" for i in range(20, 29))
"""Nine tokens: the fake engine's blocks are 4 tokens, so a repeat finds 8 of them cached (two
full blocks; the last token is always computed)."""
CACHED = 8


def output(cached: int, finished: bool = True) -> RequestOutput:
    metrics = RequestMetrics(arrival_time=0.0, num_cached_tokens=cached)
    return RequestOutput("e", [1] * 9, [5, 6], " w5 w6", finished, "length", metrics)


def test_cached_tokens_count_once_per_prompt_as_prompt_tokens_do():
    """Two prompts x n=2: each prompt counts once, with the fewest tokens any of its choices
    found (a choice that hit its sibling's fresh blocks does not make a new prompt cached)."""
    record = RequestRecord("r", "completions", "m")
    found = [8, 12, 0, 4]  # prompt 0: choices 0, 1; prompt 1: choices 2, 3
    for i, cached in enumerate(found):
        choice = ChoiceRecord(i, f"r-{i}", i // 2, 9 + 3 * (i // 2))
        choice.update(output(cached), now=1.0)
        record.choices.append(choice)
    assert (record.prompt_tokens, record.cached_tokens) == (9 + 12, 8 + 0)
    assert record.summary()["cached_tokens"] == 8
    assert [c["cached_tokens"] for c in record.trace()["choices"]] == found
    body = usage(record.prompt_tokens, record.completion_tokens, record.cached_tokens)
    assert body["prompt_tokens_details"] == {"cached_tokens": 8}
    assert body["total_tokens"] == 21 + 8


def test_usage_with_cached_tokens_fits_the_response_models():
    u = usage(9, 2, CACHED)
    envelope = {"id": "cmpl-r", "created": 1, "model": "m", "system_fingerprint": None}
    choice = {
        "index": 0,
        "text": "x",
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }
    full = {**envelope, "object": "text_completion", "choices": [choice], "usage": u}
    assert CompletionResponse.model_validate(full).usage.prompt_tokens_details.cached_tokens == 8
    chunk = {**envelope, "object": "text_completion", "choices": [], "usage": u}
    assert CompletionChunk.model_validate(chunk).usage.prompt_tokens_details.cached_tokens == 8


def test_hit_rate_is_over_the_last_minute():
    tracker = StatsTracker()
    estats = {"prefix_caching": True}
    assert tracker.prefix_cache(estats)["hit_rate_perc"] is None  # nothing sampled yet
    for t, queries, hits in ((0.0, 0, 0), (30.0, 100, 90), (61.0, 300, 190)):
        tracker.sample_engine(
            {"prefix_cache_queries_total": queries, "prefix_cache_hits_total": hits}, now=t
        )
    cache = tracker.prefix_cache(estats)
    # the sample at 0 s is older than the window: the rate is over 30 s .. 61 s
    assert cache == {
        "enabled": True,
        "hit_rate_perc": 50.0,
        "queries": 200,
        "hits": 100,
        "window_s": 31.0,
    }
    assert PREFIX_CACHE_WINDOW_S == 60.0
    tracker.sample_engine(
        {"prefix_cache_queries_total": 300, "prefix_cache_hits_total": 190}, now=95.0
    )
    assert tracker.prefix_cache(estats)["hit_rate_perc"] is None  # nothing looked up since 61 s


async def test_trace_has_the_engines_prefix_cache_hit():
    async with fake_client() as client:
        for rid in ("first", "again"):
            body = {"prompt": PROMPT, "max_tokens": 2}
            await client.post(COMPLETIONS, json=body, headers={"X-Request-Id": rid})
        first = await (await client.get("/v1/requests/first")).json()
        again = await (await client.get("/v1/requests/again")).json()
    assert "prefix_cache_hit" not in [e["event"] for e in first["events"]]
    (hit,) = [e for e in again["events"] if e["event"] == "prefix_cache_hit"]
    assert hit["source"] == "engine" and hit["detail"] == {"tokens": CACHED}
    chunk = next(e for e in again["events"] if e["event"] == "prefill_chunk")
    assert chunk["detail"] == {"tokens": 1, "start": CACHED}


def counter(text: str, name: str) -> float:
    return float(re.search(rf'^{name}\{{model_name="fake-model"\}} (\S+)$', text, re.M).group(1))


async def stats_when(client, done) -> dict:
    """/v1/stats once done(document) holds (the sampler reads the engine's counters four times
    a second)."""
    for _ in range(200):
        stats = await (await client.get("/v1/stats")).json()
        if done(stats):
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"/v1/stats never got there: {stats['kv']}")


async def test_counters_and_stats_count_tokens_looked_up_and_found():
    async with fake_client() as client:
        await stats_when(client, lambda s: s["kv"]["prefix_cache"]["window_s"] > 0)  # idle
        for _ in range(2):
            await client.post(COMPLETIONS, json={"prompt": PROMPT, "max_tokens": 2})
        text = await (await client.get("/metrics")).text()
        assert counter(text, "vllm:prefix_cache_queries_total") == 2 * 9
        assert counter(text, "vllm:prefix_cache_hits_total") == CACHED
        assert "# TYPE vllm:prefix_cache_hits_total counter" in text
        stats = await stats_when(client, lambda s: s["kv"]["prefix_cache"]["queries"] == 18)
    cache = stats["kv"]["prefix_cache"]
    assert cache["enabled"] is True and cache["hits"] == CACHED
    assert cache["hit_rate_perc"] == pytest.approx(100 * 8 / 18)
    assert 0 < cache["window_s"] <= PREFIX_CACHE_WINDOW_S
    # the prompt and answer of each request stay cached: blocks of 4 of 11 tokens, twice alike
    assert stats["kv"]["blocks_cached"] == stats["engine"]["kv_blocks_cached"] == 2
    assert stats["engine"]["prefix_cache_queries_total"] == 18


async def test_counters_stay_at_zero_with_prefix_caching_off():
    async with fake_client(FakeEngine(prefix_caching=False)) as client:
        for _ in range(2):
            r = await client.post(COMPLETIONS, json={"prompt": PROMPT, "max_tokens": 2})
            assert (await r.json())["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        text = await (await client.get("/metrics")).text()
        stats = await (await client.get("/v1/stats")).json()
    assert counter(text, "vllm:prefix_cache_queries_total") == 0
    assert counter(text, "vllm:prefix_cache_hits_total") == 0
    cache = stats["kv"]["prefix_cache"]
    assert cache["enabled"] is False and cache["hit_rate_perc"] is None
    assert stats["kv"]["blocks_cached"] == 0


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
async def test_a_repeated_prompt_reports_cached_tokens_plain_and_streamed(path):
    if path == CHAT:
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
        cached = 8  # "user: w20 .. w28 assistant:" is 11 tokens: two full blocks of 4
    else:
        body, cached = {"prompt": PROMPT, "max_tokens": 2}, CACHED
    async with fake_client() as client:
        first = await (await client.post(path, json=body)).json()
        again = await (await client.post(path, json=body)).json()
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        events = sse_events(await (await client.post(path, json=stream)).text())
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
    assert events[-1]["usage"] == again["usage"]


async def test_n_and_several_prompts_count_each_prompt_once():
    other = " ".join(f"w{i}" for i in range(40, 49))
    async with fake_client() as client:
        body = {"prompt": PROMPT, "max_tokens": 2, "n": 2}
        fresh = await client.post(COMPLETIONS, json=body, headers={"X-Request-Id": "fresh"})
        assert (await fresh.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        trace = await (await client.get("/v1/requests/fresh")).json()
        # the second choice found the blocks the first had just computed
        assert [c["cached_tokens"] for c in trace["choices"]] == [0, CACHED]
        assert trace["cached_tokens"] == 0
        both = {"prompt": [PROMPT, other], "max_tokens": 2, "n": 2}
        r = await client.post(COMPLETIONS, json=both, headers={"X-Request-Id": "both"})
        u = (await r.json())["usage"]
        assert (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]) == (18, CACHED)
        stats = await (await client.get("/v1/stats")).json()
    rows = {row["id"]: row for row in stats["requests"]}
    assert (rows["fresh"]["cached_tokens"], rows["both"]["cached_tokens"]) == (0, CACHED)
