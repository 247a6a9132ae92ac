"""The OpenAI-compatible API on a fake engine: shapes, streaming, n, stop, seeds, usage, logprobs,
tokenize, request ids and traces, stats, metrics and the OpenAPI document."""

from __future__ import annotations

import asyncio
import json

from tests.support.fake_engine import COMPILE_MARK, EOS_MARK, FakeEngine
from tests.support.fake_server import fake_client, sse_events


async def test_completion_shape_and_usage():
    async with fake_client() as client:
        r = await client.post("/v1/completions", json={"prompt": "w10 w11 w12", "max_tokens": 5})
        assert r.status == 200
        body = await r.json()
        assert body["object"] == "text_completion" and body["model"] == "fake-model"
        (choice,) = body["choices"]
        assert choice["finish_reason"] == "length" and len(choice["text"].split()) == 5
        assert body["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 5,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 0},
        }


async def test_chat_shape_and_eos_stop():
    async with fake_client() as client:
        msgs = [{"role": "user", "content": f"w{EOS_MARK} hi"}]
        r = await client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 10})
        body = await r.json()
        assert r.status == 200 and body["object"] == "chat.completion"
        msg = body["choices"][0]["message"]
        assert msg["role"] == "assistant" and len(msg["content"].split()) == 3
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == 4  # three words + EOS


async def test_chat_stream_concatenates_to_the_full_answer_and_reports_usage():
    async with fake_client() as client:
        req = {"messages": [{"role": "user", "content": "w30"}], "max_tokens": 6, "seed": 7}
        full = await (await client.post("/v1/chat/completions", json=req)).json()
        stream_req = {**req, "stream": True, "stream_options": {"include_usage": True}}
        r = await client.post("/v1/chat/completions", json=stream_req)
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await r.text())
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        assert text == full["choices"][0]["message"]["content"]
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
        assert events[-1]["choices"] == [] and events[-1]["usage"] == full["usage"]
        assert all(e["object"] == "chat.completion.chunk" for e in events)


async def test_n_choices_differ_and_seed_reproduces():
    async with fake_client() as client:
        req = {"prompt": "w40", "max_tokens": 6, "n": 3, "seed": 123, "temperature": 0.8}
        a = await (await client.post("/v1/completions", json=req)).json()
        b = await (await client.post("/v1/completions", json=req)).json()
        texts = [c["text"] for c in a["choices"]]
        assert [c["index"] for c in a["choices"]] == [0, 1, 2]
        assert len(set(texts)) == 3
        assert texts == [c["text"] for c in b["choices"]]
        assert a["usage"]["prompt_tokens"] == 1 and a["usage"]["completion_tokens"] == 18


async def test_batch_prompts_and_token_id_prompts():
    async with fake_client() as client:
        req = {"prompt": ["w1 w2", [5, 6, 7]], "max_tokens": 2}
        body = await (await client.post("/v1/completions", json=req)).json()
        assert len(body["choices"]) == 2 and body["usage"]["prompt_tokens"] == 5


async def test_stop_string_cuts_the_text():
    async with fake_client() as client:
        base = {"prompt": "w50", "max_tokens": 8, "seed": 1}
        full = (await (await client.post("/v1/completions", json=base)).json())["choices"][0]
        words = full["text"].split()
        r = await client.post("/v1/completions", json={**base, "stop": [f" {words[3]}"]})
        choice = (await r.json())["choices"][0]
        assert choice["text"] == " " + " ".join(words[:3])
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == f" {words[3]}"


async def test_logprobs_in_both_apis():
    async with fake_client() as client:
        r = await client.post(
            "/v1/completions", json={"prompt": "w8 w9", "max_tokens": 3, "logprobs": 2}
        )
        lp = (await r.json())["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == 3 and len(lp["top_logprobs"][0]) == 2
        r = await client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "w9"}],
                "max_tokens": 2,
                "logprobs": True,
                "top_logprobs": 3,
            },
        )
        content = (await r.json())["choices"][0]["logprobs"]["content"]
        assert len(content) == 2 and len(content[0]["top_logprobs"]) == 3
        assert content[0]["bytes"] == list(content[0]["token"].encode())


async def test_models_tokenize_detokenize():
    async with fake_client() as client:
        models = await (await client.get("/v1/models")).json()
        assert models["data"][0]["id"] == "fake-model"
        tok = await (await client.post("/tokenize", json={"prompt": "w7 w8 w9"})).json()
        assert tok["tokens"] == [7, 8, 9] and tok["count"] == 3
        chat = await (
            await client.post("/tokenize", json={"messages": [{"role": "user", "content": "w7"}]})
        ).json()
        assert chat["count"] == 3  # "user:", "w7", "assistant:"
        detok = await (await client.post("/detokenize", json={"tokens": [7, 8]})).json()
        assert detok["prompt"] == " w7 w8"


async def test_request_id_is_honoured_and_trace_is_kept():
    async with fake_client() as client:
        r = await client.post(
            "/v1/completions",
            json={"prompt": "w1", "max_tokens": 3},
            headers={"X-Request-Id": "my-req-1"},
        )
        assert r.headers["X-Request-Id"] == "my-req-1"
        assert (await r.json())["id"] == "cmpl-my-req-1"
        trace = await (await client.get("/v1/requests/my-req-1")).json()
        events = [e["event"] for e in trace["events"]]
        for name in (
            "received",
            "queued",
            "arrived",
            "scheduled",
            "prefill_chunk",
            "first_token",
            "finished",
            "closed",
        ):
            assert name in events, name
        assert events.index("received") < events.index("first_token") < events.index("closed")
        assert trace["completion_tokens"] == 3 and trace["finish_reasons"] == ["length"]
        bad = await client.get("/v1/requests/nope")
        assert bad.status == 404
        odd = await client.get("/health", headers={"X-Request-Id": "bad id\twith space"})
        assert odd.headers["X-Request-Id"] != "bad id\twith space"


async def test_stats_and_metrics_reflect_work():
    async with fake_client() as client:
        for _ in range(3):
            await client.post("/v1/completions", json={"prompt": "w1 w2", "max_tokens": 4})
        stats = await (await client.get("/v1/stats")).json()
        assert stats["status"] == "ok" and stats["config"]["max_model_len"] == 128
        assert stats["engine"]["generation_tokens_total"] == 12
        assert stats["counters"]["finished_total"] == 3
        assert stats["latency"]["ttft_s"]["count"] == 3
        assert stats["latency"]["e2e_s"]["p50"] >= stats["latency"]["ttft_s"]["p50"]
        assert len(stats["requests"]) == 3 and len(stats["traces"]) == 3
        text = await (await client.get("/metrics")).text()
        assert 'vllm:generation_tokens_total{model_name="fake-model"} 12.0' in text
        assert 'vllm:time_to_first_token_seconds_count{model_name="fake-model"} 3.0' in text
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total",
            "vllm:time_per_output_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:e2e_request_latency_seconds",
        ):
            assert name in text, name


async def test_stats_and_metrics_count_compiles_after_warm_up():
    """The engine's count of Triton compiles after warm-up reaches /v1/stats and /metrics; an
    engine that cannot count them (None) shows null and no metric."""
    async with fake_client() as client:
        stats = await (await client.get("/v1/stats")).json()
        assert stats["engine"]["compiles_after_warmup"] == 0
        for _ in range(5):  # each stands in for a kernel compiled while serving
            body = {"prompt": f"w1 w{COMPILE_MARK}", "max_tokens": 2}
            await client.post("/v1/completions", json=body)
        stats = await (await client.get("/v1/stats")).json()
        assert stats["engine"]["compiles_after_warmup"] == 5
        text = await (await client.get("/metrics")).text()
        assert 'appliance:triton_compiles_after_warmup_total{model_name="fake-model"} 5.0' in text
    async with fake_client(FakeEngine(counts_compiles=False)) as client:
        await client.post("/v1/completions", json={"prompt": "w1 w2", "max_tokens": 2})
        stats = await (await client.get("/v1/stats")).json()
        assert stats["engine"]["compiles_after_warmup"] is None
        text = await (await client.get("/metrics")).text()
        assert "appliance:triton_compiles_after_warmup" not in text


async def test_stats_and_metrics_report_speculative_decoding():
    """The engine's draft counters reach /metrics (vLLM's names) and /v1/stats (with the
    acceptance rate and mean accepted length); without speculation: null and no metric."""
    async with fake_client(FakeEngine(speculative="ngram")) as client:
        await client.post("/v1/completions", json={"prompt": "w1 w2", "max_tokens": 4})
        spec = (await (await client.get("/v1/stats")).json())["engine"]["spec_decode"]
        assert spec["num_drafts"] > 0
        assert spec["num_draft_tokens"] == 2 * spec["num_drafts"]
        assert spec["acceptance_rate"] == 0.5 and spec["mean_accepted_length"] == 1.0
        text = await (await client.get("/metrics")).text()
        drafts = (
            f'vllm:spec_decode_num_drafts_total{{model_name="fake-model"}} {spec["num_drafts"]}'
        )
        assert drafts in text
        assert "vllm:spec_decode_num_draft_tokens_total" in text
        assert "vllm:spec_decode_num_accepted_tokens_total" in text
    async with fake_client() as client:
        assert (await (await client.get("/v1/stats")).json())["engine"]["spec_decode"] is None
        assert "vllm:spec_decode" not in await (await client.get("/metrics")).text()


async def test_stats_stream_sends_snapshots():
    async with fake_client() as client:
        r = await client.get("/v1/stats/stream")
        first = await r.content.readuntil(b"\n\n")
        second = await r.content.readuntil(b"\n\n")
        a, b = (json.loads(x.decode()[len("data: ") :]) for x in (first, second))
        assert a["object"] == b["object"] == "appliance.stats" and b["time"] > a["time"]
        r.close()


async def test_openapi_describes_exactly_the_routes():
    async with fake_client() as client:
        spec = await (await client.get("/openapi.json")).json()
        routes = {
            (r.resource.canonical, r.method.lower())
            for r in client.app.router.routes()
            if r.method != "HEAD"
        }
        documented = {(p, m) for p, ops in spec["paths"].items() for m in ops}
        assert spec["openapi"].startswith("3.")
        assert routes == documented


async def test_cors_only_when_configured():
    async with fake_client() as client:
        r = await client.get("/health", headers={"Origin": "http://x.example"})
        assert "Access-Control-Allow-Origin" not in r.headers
    async with fake_client(cors_origin=["http://x.example"]) as client:
        r = await client.get("/health", headers={"Origin": "http://x.example"})
        assert r.headers["Access-Control-Allow-Origin"] == "http://x.example"
        pre = await client.options(
            "/v1/completions",
            headers={"Origin": "http://x.example", "Access-Control-Request-Method": "POST"},
        )
        assert pre.status == 204


async def test_request_log_is_written(tmp_path):
    path = tmp_path / "requests.jsonl"
    async with fake_client(FakeEngine(), log_requests=str(path)) as client:
        await client.post(
            "/v1/completions",
            json={"prompt": "w1", "max_tokens": 2},
            headers={"X-Request-Id": "logged"},
        )
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["id"] == "logged" and lines[0]["completion_tokens"] == 2


async def test_duplicate_request_ids_in_flight_both_succeed():
    async with fake_client(FakeEngine(step_time=0.01)) as client:
        body = {"prompt": "w1", "max_tokens": 5}
        headers = {"X-Request-Id": "same"}
        a, b = await asyncio.gather(
            client.post("/v1/completions", json=body, headers=headers),
            client.post("/v1/completions", json=body, headers=headers),
        )
        assert a.status == b.status == 200
        ids = {a.headers["X-Request-Id"], b.headers["X-Request-Id"]}
        assert ids == {"same", "same~2"}
        for rid in ids:
            assert (await client.get(f"/v1/requests/{rid}")).status == 200
