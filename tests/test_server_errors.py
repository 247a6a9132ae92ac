"""Every error a client can meet: status, OpenAI envelope and a message that names the problem.
Also overload (429), timeouts, disconnects, API keys and loading."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import pytest

from appliance.server.app_keys import STATE
from tests.support.fake_engine import CRASH_MARK, STALL_MARK, FakeEngine
from tests.support.fake_server import SlowLoader, fake_client, wait_until_served

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


async def expect_error(resp, status: int, *fragments: str, type_: str | None = None) -> dict:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in err["message"], err["message"]
    if type_:
        assert err["type"] == type_
    return err


async def wait_for_idle(client, timeout: float = 2.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = await (await client.get("/v1/stats")).json()
        if stats["engine"]["kv_blocks_used"] == 0 and stats["engine"]["num_running"] == 0:
            return stats
        assert time.monotonic() < deadline, stats["engine"]
        await asyncio.sleep(0.02)


async def test_context_length_message_names_the_numbers():
    async with fake_client() as client:
        prompt = " ".join(f"w{10 + i}" for i in range(100))
        r = await client.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": 50})
        err = await expect_error(
            r,
            400,
            "This model's maximum context length is 128 tokens; the request asks for "
            "150 (100 in the prompt, 50 to generate)",
            type_="invalid_request_error",
        )
        assert err["code"] == "context_length_exceeded"


BAD_COMPLETIONS = [
    ({"temperature": "hot"}, "'temperature' must be a number, got a string"),
    ({"temperature": 3}, "'temperature' must be in [0.0, 2.0]"),
    ({"top_p": 0}, "'top_p' must be in (0.0, 1.0]"),
    ({"n": 0}, "'n' must be in [1, 128]"),
    ({"max_tokens": -1}, "'max_tokens' must be >= 1"),
    ({"max_tokens": True}, "'max_tokens' must be an integer, got a boolean"),
    ({"max_tokens": 2.5}, "'max_tokens' must be an integer"),
    ({"seed": -5}, "'seed' must be in [0,"),
    ({"stop": 5}, "'stop' must be a non-empty string"),
    ({"stop": [""]}, "'stop' must be a non-empty string"),
    ({"logprobs": 50}, "'logprobs' must be in [0, 20]"),
    ({"stream": "yes"}, "'stream' must be a boolean"),
    ({"presence_penalty": 9}, "'presence_penalty' must be in [-2.0, 2.0]"),
    ({"prompt": ""}, "'prompt' must not be empty"),
    ({"prompt": []}, "'prompt' must be a string"),
    ({"prompt": [1, "x"]}, "'prompt' must be a string"),
    ({"prompt": [1, 99999]}, "prompt token ids must be integers in [0, 512)"),
    ({"foo": 1}, "Unrecognized request argument supplied: foo"),
    ({"echo": True}, "'echo' is not supported"),
    ({"logit_bias": {"5": 1}}, "'logit_bias' is not supported"),
    ({"n": 20}, "this server allows at most 16"),
    ({"temperature": 10**400}, "'temperature' must be a finite number"),
    ({"stop_token_ids": [5, -1]}, "stop_token_ids[1] must be >= 0, got -1"),
    (
        {"stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage must be a boolean",
    ),
    ({"best_of": 3}, "'best_of' different from 'n' is not supported"),
]


@pytest.mark.parametrize("patch,message", BAD_COMPLETIONS)
async def test_bad_completion_parameters(patch, message):
    async with fake_client() as client:
        body = {"prompt": "w10", "max_tokens": 2, **patch}
        await expect_error(await client.post(COMPLETIONS, json=body), 400, message)
        stats = await (await client.get("/v1/stats")).json()
        assert stats["requests_in_flight"] == 0


BAD_CHATS = [
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"messages": "hi"}, "'messages' must be a non-empty list"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role must be one of"),
    (  # content may be left out only where tool_calls stand instead
        {"messages": [{"role": "user"}]},
        "messages[0].content may be null only in an assistant message with tool_calls",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "image parts"),
    ({"tools": [{"type": "function"}]}, "tools[0].function is required"),
    (
        {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
        "tools[0].function.name must be letters, digits, '_', '.' or '-'",
    ),
    ({"top_logprobs": 2}, "'top_logprobs' needs 'logprobs': true"),
    ({"max_completion_tokens": 0}, "'max_completion_tokens' must be >= 1"),
    ({"messages": [5]}, "messages[0] must be an object, got a number"),
    (
        {"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c1"}]}]},
        "messages[0].tool_calls[0].function is required",
    ),
    (
        {"response_format": {"type": "json_schema"}},
        'response_format of type "json_schema" needs "json_schema"',
    ),
    ({"response_format": {"type": "xml"}}, "response_format.type must be one of"),
    ({"regex": "a+", "choice": ["b"]}, "send at most one of regex, choice"),
    ({"choice": []}, "'choice' must"),
    ({"tool_choice": "required"}, "tool_choice \"required\" needs 'tools'"),
    ({"tool_choice": "always"}, "'tool_choice' must be"),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        "tool_choice names the function 'g', which is not in tools (f)",
    ),
]


@pytest.mark.parametrize("patch,message", BAD_CHATS)
async def test_bad_chat_parameters(patch, message):
    async with fake_client() as client:
        body = {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2, **patch}
        await expect_error(await client.post(CHAT, json=body), 400, message)


async def test_param_is_the_parameters_json_path():
    async with fake_client() as client:
        msg = {"role": "user", "content": "w1"}
        for path, body, param in [
            (COMPLETIONS, {"prompt": "w1", "top_p": 2}, "top_p"),
            (COMPLETIONS, {"prompt": "w1", "extra_thing": 1}, "extra_thing"),
            (COMPLETIONS, {"prompt": "w1", "metadata": {"team": 7}}, "metadata.team"),
            (CHAT, {"messages": [msg, {"role": "robot", "content": "x"}]}, "messages[1].role"),
            (CHAT, {"messages": [msg, {"role": "user"}]}, "messages[1].content"),
            (CHAT, {"messages": [msg], "tools": [{"type": "function"}]}, "tools[0].function"),
        ]:
            err = await expect_error(await client.post(path, json=body), 400, param)
            assert err["param"] == param


async def test_null_means_the_default():
    async with fake_client() as client:
        body = {"prompt": "w1", "max_tokens": 2, "temperature": None, "stop": None, "n": None}
        r = await client.post(COMPLETIONS, json=body)
        assert r.status == 200 and len((await r.json())["choices"]) == 1
        await expect_error(
            await client.post(COMPLETIONS, json={**body, "nope": None}),
            400,
            "Unrecognized request argument supplied: nope",
        )


async def test_invalid_json_utf8_and_non_objects_are_400():
    async with fake_client() as client:
        for data, fragment in [
            (b"{not json", "not valid JSON"),
            (b'{"prompt": "\xff\xfe"}', "not valid UTF-8"),
            (b"[1, 2]", "must be a JSON object"),
            (b'{"prompt": "w1", "temperature": NaN}', "'temperature' must be a finite number"),
            (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
            (b"", "not valid JSON"),
        ]:
            r = await client.post(COMPLETIONS, data=data)
            await expect_error(r, 400, fragment)


async def test_unknown_model_route_and_method():
    async with fake_client() as client:
        r = await client.post(
            CHAT, json={"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}
        )
        err = await expect_error(r, 404, "The model 'gpt-4' does not exist", "'fake-model'")
        assert err["code"] == "model_not_found"
        await expect_error(await client.get("/v1/nothing"), 404, "no such route")
        await expect_error(await client.get(COMPLETIONS), 405, "not allowed")
        r = await client.post(
            COMPLETIONS, json={"model": "fake-model", "prompt": "w1", "max_tokens": 1}
        )
        assert r.status == 200


async def test_body_over_the_limit_is_413():
    async with fake_client(max_body_bytes=1000) as client:
        r = await client.post(COMPLETIONS, json={"prompt": "w1 " * 1000})
        await expect_error(r, 413, "too large", type_="request_too_large")


async def test_api_keys(tmp_path, caplog):
    keyfile = tmp_path / "keys"
    keyfile.write_text("# team keys\nalice sk-alice-0123456789\nsk-anon-0123456789\n")
    caplog.set_level(logging.INFO)
    async with fake_client(api_key_file=str(keyfile), api_key=["ops:sk-ops-0123456789"]) as client:
        body = {"prompt": "w1", "max_tokens": 1}
        err = await expect_error(await client.post(COMPLETIONS, json=body), 401, "missing API key")
        assert err["type"] == "authentication_error"
        bad = {"Authorization": "Bearer sk-wrong-0123456789"}
        await expect_error(await client.post(COMPLETIONS, json=body, headers=bad), 401, "invalid")
        await expect_error(await client.get("/v1/stats"), 401)
        assert (await client.get("/health")).status == 200
        for key, name in [
            ("sk-alice-0123456789", "alice"),
            ("sk-anon-0123456789", "key3"),
            ("sk-ops-0123456789", "ops"),
        ]:
            r = await client.post(
                COMPLETIONS, json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert r.status == 200
            rid = r.headers["X-Request-Id"]
            trace = await (
                await client.get(f"/v1/requests/{rid}", headers={"X-Api-Key": key})
            ).json()
            assert trace["key_name"] == name
    assert "sk-alice" not in caplog.text and "sk-wrong" not in caplog.text
    assert "key=alice" in caplog.text


async def test_loading_is_503_until_the_engine_is_ready(tmp_path):
    from aiohttp.test_utils import TestClient, TestServer

    from appliance.server import create_app
    from appliance.settings import ServeSettings

    release = tmp_path / "release"
    app = create_app(ServeSettings(warmup=True), loader=SlowLoader(str(release)))
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/health")
        assert r.status == 503 and (await r.json())["status"] == "loading"
        r = await client.post(COMPLETIONS, json={"prompt": "w1"})
        err = await expect_error(r, 503, "the model is loading")
        assert err["code"] == "loading" and r.headers["Retry-After"]
        release.touch()
        await wait_until_served(client)
        r = await client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 2})
        assert r.status == 200


async def test_queue_overflow_is_429_fast_and_admitted_requests_complete():
    engine = FakeEngine(step_time=0.01, max_num_seqs=1)
    async with fake_client(engine, max_queue=1) as client:
        body = {"prompt": "w1", "max_tokens": 50}
        admitted = [asyncio.create_task(client.post(COMPLETIONS, json=body)) for _ in range(2)]
        await asyncio.sleep(0.1)
        start = time.monotonic()
        r = await client.post(COMPLETIONS, json=body)
        elapsed = time.monotonic() - start
        err = await expect_error(r, 429, "at capacity", type_="rate_limit_error")
        assert int(r.headers["Retry-After"]) >= 1 and err["code"] == "queue_full"
        assert elapsed < 0.2
        for resp in await asyncio.gather(*admitted):
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["finish_reason"] == "length"
        stats = await (await client.get("/v1/stats")).json()
        assert stats["counters"]["rejected_total"] == 1
        metrics = await (await client.get("/metrics")).text()
        assert 'appliance:requests_rejected_total{model_name="fake-model"} 1.0' in metrics


async def test_ttft_timeout():
    engine = FakeEngine(max_num_seqs=1)
    async with fake_client(engine, ttft_timeout=0.3) as client:
        blocker = asyncio.create_task(
            client.post(
                COMPLETIONS, json={"prompt": f"w{STALL_MARK}", "max_tokens": 50, "stream": True}
            )
        )
        await asyncio.sleep(0.05)
        r = await client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 5})
        err = await expect_error(r, 504, "no first token within 0.3 s", type_="ttft_timeout_error")
        assert err["code"] == "ttft_timeout"
        blocker.cancel()
        stats = await (await client.get("/v1/stats")).json()
        assert stats["counters"]["timeouts_total"]["ttft_timeout"] >= 1


async def test_stall_timeout_plain_and_streamed():
    async with fake_client(stall_timeout=0.2) as client:
        body = {"prompt": f"w{STALL_MARK} w9", "max_tokens": 20}
        r = await client.post(COMPLETIONS, json=body)
        await expect_error(r, 504, "no new token for 0.2 s", type_="stall_timeout_error")
        r = await client.post(COMPLETIONS, json={**body, "stream": True})
        assert r.status == 200
        lines = [x for x in (await r.text()).split("\n") if x.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert '"type": "stall_timeout_error"' in lines[-2] or '"stall_timeout_error"' in lines[-2]
        await wait_for_idle(client)


async def test_total_request_timeout():
    async with fake_client(FakeEngine(step_time=0.02), request_timeout=0.2) as client:
        r = await client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 100})
        await expect_error(r, 504, "did not finish within 0.2 s", type_="request_timeout_error")
        await wait_for_idle(client)


async def test_disconnect_mid_stream_frees_blocks():
    async with fake_client(FakeEngine(step_time=0.01)) as client:
        r = await client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 100, "stream": True})
        await r.content.readuntil(b"\n\n")
        stats = await (await client.get("/v1/stats")).json()
        assert stats["engine"]["kv_blocks_used"] > 0
        r.close()
        stats = await wait_for_idle(client)
        assert stats["requests_in_flight"] == 0
        assert stats["counters"]["cancelled_total"] == 1


async def test_disconnect_while_waiting_for_a_plain_response_frees_blocks():
    async with fake_client(FakeEngine(step_time=0.01)) as client:
        with pytest.raises(asyncio.TimeoutError):
            await client.post(
                COMPLETIONS,
                json={"prompt": "w1", "max_tokens": 100},
                timeout=aiohttp.ClientTimeout(total=0.1),
            )
        await wait_for_idle(client)


async def test_engine_failure_is_an_error_not_a_hang():
    engine = FakeEngine(step_time=0.01)
    async with fake_client(engine) as client:
        task = asyncio.create_task(
            client.post(COMPLETIONS, json={"prompt": "w1", "max_tokens": 100})
        )
        await asyncio.sleep(0.05)
        crash = client.post(COMPLETIONS, json={"prompt": f"w{CRASH_MARK}", "max_tokens": 2})
        r, crashed = await asyncio.wait_for(asyncio.gather(task, crash), 5)
        await expect_error(r, 500, "simulated engine crash")
        await expect_error(crashed, 503, "simulated engine crash")  # crashed before accepted
        health = await client.get("/health")
        assert health.status == 503 and (await health.json())["status"] == "error"
        r = await client.post(COMPLETIONS, json={"prompt": "w1"})
        await expect_error(r, 503, "not running")


async def test_killing_the_engine_process_ends_every_stream_with_an_error_event():
    """The core process dies mid-stream (SIGKILL): each open stream gets an error event and
    [DONE], new requests a 503, and nothing hangs."""
    async with fake_client(FakeEngine(step_time=0.01)) as client:
        state = client.server.app[STATE]
        body = {"prompt": "w1", "max_tokens": 100, "stream": True}
        streams = [await client.post(COMPLETIONS, json=body) for _ in range(3)]
        for r in streams:  # every stream has begun
            assert (await r.content.readuntil(b"\n\n")).startswith(b"data: ")
        state.process.process.kill()
        for r in streams:
            text = (await asyncio.wait_for(r.text(), 5)).split("\n\n")
            error = json.loads(next(e for e in text if '"error"' in e)[len("data: ") :])
            assert "engine" in error["error"]["message"] and text[-2] == "data: [DONE]"
        assert state.core_gone.is_set()
        r = await client.post(COMPLETIONS, json={"prompt": "w1"})
        await expect_error(r, 503, "not running")
        health = await client.get("/health")
        assert health.status == 503 and "exited" in (await health.json())["error"]
