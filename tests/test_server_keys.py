"""Per-key limits on the fake-engine server: a key past its concurrency limit gets 429 (with
Retry-After and the x-ratelimit-* headers) while another key is served; caps; the request log
names the key; /v1/stats "keys" and the key-labelled /metrics series move by what was sent."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from appliance.server.protocol import parse_completion
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client

COMPLETIONS = "/v1/completions"
BATCH = {"Authorization": "Bearer sk-batch-0123456"}
CHAT = {"Authorization": "Bearer sk-chat-01234567"}
RATE_HEADERS = [
    f"x-ratelimit-{what}-{unit}"
    for unit in ("requests", "tokens")
    for what in ("limit", "remaining", "reset")
]


def metric(text: str, name: str, key: str) -> float:
    """The value of series `name` with label key="`key`" in a /metrics page (0 when absent)."""
    pattern = re.compile(rf'^{re.escape(name)}\{{[^}}]*key="{key}"[^}}]*\}} (\S+)$', re.M)
    match = pattern.search(text)
    return float(match.group(1)) if match else 0.0


async def keys_section(client) -> dict:
    return (await (await client.get("/v1/stats", headers=CHAT)).json())["keys"]


async def wait_not_running(client, name: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = await keys_section(client)
        if keys[name]["running"] == 0:
            return keys
        await asyncio.sleep(0.02)
    raise AssertionError(f"key {name!r} still holds a request: {keys[name]}")


async def test_key_over_its_concurrency_limit_gets_429_while_another_key_is_served(tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text(
        "batch sk-batch-0123456 max_concurrent=1 rpm=100 tpm=100000 priority=batch\n"
        "chat sk-chat-01234567\n"
    )
    log = tmp_path / "requests.jsonl"
    engine = FakeEngine(step_time=0.01)
    async with fake_client(engine, api_key_file=str(keyfile), log_requests=str(log)) as client:
        before_keys = await keys_section(client)
        assert before_keys["batch"]["priority"] == "batch"
        assert before_keys["chat"]["priority"] == "interactive"
        assert "anonymous" not in before_keys  # keys on: every request has a key
        before = await (await client.get("/metrics", headers=CHAT)).text()

        # batch's one slot is taken by a stream; its next request is refused ...
        held = await client.post(
            COMPLETIONS,
            json={"prompt": "w1 w2", "max_tokens": 100, "stream": True},
            headers=BATCH,
        )
        assert held.status == 200
        assert held.headers["x-ratelimit-remaining-requests"] == "99"
        assert held.headers["x-ratelimit-remaining-tokens"] == str(100000 - 2)
        await held.content.readuntil(b"\n\n")
        r = await client.post(COMPLETIONS, json={"prompt": "w5", "max_tokens": 3}, headers=BATCH)
        assert r.status == 429
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert all(h in r.headers for h in RATE_HEADERS)
        assert r.headers["x-ratelimit-limit-requests"] == "100"
        assert r.headers["x-ratelimit-limit-tokens"] == "100000"
        err = (await r.json())["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "concurrency_limit"
        assert "key 'batch'" in err["message"] and "1 concurrent requests" in err["message"]
        assert "Retry after" in err["message"]

        # ... while the other key is served
        r = await client.post(
            COMPLETIONS, json={"prompt": "w7 w8 w9", "max_tokens": 4}, headers=CHAT
        )
        assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 4
        assert not any(h in r.headers for h in RATE_HEADERS)  # chat has no RPM/TPM limit
        assert (await keys_section(client))["batch"]["running"] == 1

        # the client goes away: the slot comes back, and batch is served again
        held.close()
        await wait_not_running(client, "batch")
        r = await client.post(COMPLETIONS, json={"prompt": "w5", "max_tokens": 3}, headers=BATCH)
        assert r.status == 200
        assert r.headers["x-ratelimit-remaining-requests"] == "98"

        keys = await keys_section(client)
        after = await (await client.get("/metrics", headers=CHAT)).text()

    b, c = keys["batch"], keys["chat"]
    assert (b["requests_total"], b["rejected_total"], b["running"]) == (2, 1, 0)
    assert b["prompt_tokens_total"] == 2 + 1
    assert 1 + 3 <= b["generation_tokens_total"] < 100 + 3  # the held stream was cut short
    assert (c["requests_total"], c["rejected_total"], c["running"]) == (1, 0, 0)
    assert (c["prompt_tokens_total"], c["generation_tokens_total"]) == (3, 4)
    moved = {
        (name, key): metric(after, name, key) - metric(before, name, key)
        for name in (
            "appliance:key_requests_total",
            "appliance:key_requests_rejected_total",
            "appliance:key_prompt_tokens_total",
            "appliance:key_generation_tokens_total",
        )
        for key in ("batch", "chat")
    }
    assert moved == {
        ("appliance:key_requests_total", "batch"): 2,
        ("appliance:key_requests_total", "chat"): 1,
        ("appliance:key_requests_rejected_total", "batch"): 1,
        ("appliance:key_requests_rejected_total", "chat"): 0,
        ("appliance:key_prompt_tokens_total", "batch"): 3,
        ("appliance:key_prompt_tokens_total", "chat"): 3,
        ("appliance:key_generation_tokens_total", "batch"): b["generation_tokens_total"],
        ("appliance:key_generation_tokens_total", "chat"): 4,
    }
    assert metric(after, "appliance:key_requests_running", "batch") == 0
    labels = '{key="chat",model_name="fake-model",priority="interactive"}'
    assert f"appliance:key_queue_seconds_total{labels}" in after

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(line["key_name"] for line in lines) == ["batch", "batch", "chat"]
    assert "sk-" not in log.read_text()  # the name, never the secret
    for name, entry in keys.items():
        # a key's queue time is the sum of its requests' (as logged), in /v1/stats and /metrics
        queued = sum(line["queue_s"] or 0.0 for line in lines if line["key_name"] == name)
        assert entry["queue_seconds_total"] == pytest.approx(queued, abs=1e-9), name
        series = "appliance:key_queue_seconds_total"
        moved_s = metric(after, series, name) - metric(before, series, name)
        assert moved_s == pytest.approx(queued, abs=1e-6), name


async def test_caps_and_the_anonymous_class():
    async with fake_client(default_priority="batch", default_limits="rpm=2 max_tokens=5") as client:
        r = await client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 6})
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["param"] == "max_tokens" and "cap (max_tokens) of 5" in err["message"]
        msgs = [{"role": "user", "content": "w1"}]
        r = await client.post("/v1/chat/completions", json={"messages": msgs})
        assert r.status == 200  # an omitted max_tokens is clamped to the cap
        assert (await r.json())["usage"]["completion_tokens"] == 5
        assert r.headers["x-ratelimit-remaining-requests"] == "1"
        await client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 2})
        r = await client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 2})
        assert r.status == 429 and 55 <= int(r.headers["Retry-After"]) <= 60
        assert (await r.json())["error"]["code"] == "requests_per_minute"
        keys = (await (await client.get("/v1/stats")).json())["keys"]
    # the 400 was refused before admission: neither a request nor a 429
    assert keys == {
        "anonymous": {
            "priority": "batch",
            "requests_total": 2,
            "rejected_total": 1,
            "running": 0,
            "prompt_tokens_total": keys["anonymous"]["prompt_tokens_total"],
            "generation_tokens_total": 5 + 2,
            "queue_seconds_total": keys["anonymous"]["queue_seconds_total"],
        }
    }


def test_requests_carry_the_keys_priority_and_name():
    req = parse_completion({"prompt": "w1", "max_tokens": 3})
    params = req.params(0, 3, "batch", "alice", 2.5)
    assert (params.priority, params.client, params.share_weight) == ("batch", "alice", 2.5)
    default = req.params(0, 3)
    assert (default.priority, default.client, default.share_weight) == ("interactive", None, 1.0)
