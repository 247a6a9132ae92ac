"""Several models behind one server: two tiny random models, the embedded one (pinned) and a
broken folder, under a memory budget that holds one unpinned model at a time. Requests that
alternate between models load them on demand and each model answers with its own tokens; a
swap never cuts a request in flight; the pinned model never unloads; the broken model fails
only its own requests; an unload waits for a running stream; /v1/models says where each
model stands."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from appliance.model_memory import expected_bytes
from appliance.server import create_app
from appliance.server.app_keys import REGISTRY, STATE
from appliance.server.state import Phase
from appliance.settings import ServeSettings
from engine.models.embedded import default_model_path
from tests.support.tiny_models import make_tiny_model
from tests.support.waiting import wait_until

GIB = 1024**3
pytestmark = pytest.mark.asyncio(loop_scope="module")
PROMPT = {"prompt": "hello there", "max_tokens": 8, "temperature": 0}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    a = make_tiny_model("llama", root / "a", seed=1)
    b = make_tiny_model("qwen2", root / "b", seed=2)
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-family"}')
    settings = ServeSettings(
        model=[f"a={a}", f"b={b}", f"smol={default_model_path()}", f"broken={broken}", f"c={a}"],
        models={
            "smol": {"pinned": True, "max_model_len": 256},
            "a": {"aliases": ["alpha-*"]},
            "c": {"keep_alive": 1},
        },
        device="cpu",
        warmup=False,
        max_model_len=512,
        num_kv_blocks=48,
        max_num_seqs=4,
        log_level="warning",
    )
    # the budget holds the pinned model and one tiny model, never both tiny ones
    planned = {s.name: expected_bytes(settings.for_model(s)) for s in settings.model_specs}
    budget = planned["smol"] + 1.5 * max(planned["a"], planned["b"])
    app = create_app(replace(settings, models_memory=budget / GIB))
    async with TestClient(TestServer(app)) as client:
        front = app[STATE]
        await wait_until(lambda: front.phase is Phase.READY, timeout_s=120, what="start-up")
        yield client


async def models(client: TestClient) -> dict[str, dict]:
    resp = await client.get("/v1/models")
    assert resp.status == 200
    body = await resp.json()
    assert body["object"] == "list"
    return {card["id"]: card for card in body["data"]}


async def complete(client: TestClient, model: str, **extra) -> dict:
    resp = await client.post("/v1/completions", json={**PROMPT, "model": model, **extra})
    body = await resp.json()
    assert resp.status == 200, body
    return body


async def test_at_start_only_the_pinned_model_is_loaded(client):
    cards = await models(client)
    assert list(cards) == ["a", "b", "smol", "broken", "c"]
    assert {n: c["status"] for n, c in cards.items()} == {
        "a": "unloaded",
        "b": "unloaded",
        "smol": "loaded",
        "broken": "unloaded",
        "c": "unloaded",
    }
    for probe in ("/health", "/health/ready", "/health/live"):
        assert (await client.get(probe)).status == 200
    stats = await (await client.get("/v1/stats")).json()
    assert {m["name"]: m["status"] for m in stats["models"]} == {
        n: c["status"] for n, c in cards.items()
    }
    assert all(c["object"] == "model" and c["kind"] == "generate" for c in cards.values())
    assert cards["smol"]["pinned"] and cards["smol"]["max_model_len"] == 256
    assert cards["smol"]["memory_bytes"] > 0


async def test_alternating_requests_swap_models_and_each_answers_its_own_tokens(client):
    first_a = await complete(client, "a")
    first_b = await complete(client, "b")
    again_a = await complete(client, "alpha-1")  # an alias of a
    smol = await complete(client, "smol")
    assert first_a["model"] == "a" and first_b["model"] == "b" and again_a["model"] == "a"
    texts = [r["choices"][0]["text"] for r in (first_a, first_b, smol)]
    assert again_a["choices"][0]["text"] == texts[0]  # a reloaded computes what it did
    assert len(set(texts)) == 3
    cards = await models(client)
    assert cards["a"]["status"] == "loaded" and cards["b"]["status"] == "unloaded"
    assert cards["smol"]["status"] == "loaded"  # pinned: never the one unloaded
    metrics = await (await client.get("/metrics")).text()
    for model in ("a", "smol"):  # the loaded engines' series, and every model's requests
        assert f'vllm:generation_tokens_total{{model_name="{model}"}}' in metrics
    assert 'vllm:request_success_total{finished_reason="length",model_name="b"}' in metrics


async def test_a_swap_never_cuts_a_request_in_flight(client):
    entries = client.app[REGISTRY].entries
    long_a = asyncio.create_task(complete(client, "a", max_tokens=400, ignore_eos=True))
    await wait_until(lambda: entries["a"].holds > 0, timeout_s=30, what="a's request running")
    b = await complete(client, "b")  # a is busy: b loads beside it (over the budget)
    body_a = await long_a
    assert b["model"] == "b"
    assert body_a["usage"]["completion_tokens"] == 400
    assert body_a["choices"][0]["finish_reason"] == "length"
    # both idle now: the registry sheds the one used less recently, back within its budget
    loaded = lambda: [n for n in ("a", "b") if entries[n].state is not None]  # noqa: E731
    await wait_until(lambda: len(loaded()) == 1, timeout_s=30, what="one tiny model unloaded")
    cards = await models(client)
    assert [n for n in ("a", "b") if cards[n]["status"] == "loaded"] == loaded()
    assert cards["smol"]["status"] == "loaded"


async def test_a_broken_model_fails_only_its_own_requests(client):
    await complete(client, "a")  # loaded: the broken model must not unload it to make room
    resp = await client.post("/v1/completions", json={**PROMPT, "model": "broken"})
    body = await resp.json()
    assert resp.status == 503
    assert body["error"]["code"] == "model_load_failed"
    assert "broken" in body["error"]["message"] and "failed to load" in body["error"]["message"]
    assert (await complete(client, "smol"))["model"] == "smol"
    cards = await models(client)
    assert cards["broken"]["status"] == "unloaded" and cards["broken"]["error"]
    error = cards["broken"]["error"]
    assert "no-such-family" in error or "architecture" in error
    assert cards["a"]["status"] == "loaded"


async def test_an_unknown_model_gets_the_404_envelope(client):
    resp = await client.post("/v1/completions", json={**PROMPT, "model": "nope"})
    body = await resp.json()
    assert resp.status == 404 and body["error"]["code"] == "model_not_found"
    assert "'a'" in body["error"]["message"]


async def test_unload_while_streaming_waits_for_the_stream(client):
    await client.post("/v1/models/a/load")
    body = {**PROMPT, "model": "a", "max_tokens": 400, "ignore_eos": True, "stream": True}
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200
    first = await resp.content.readline()
    assert first.startswith(b"data: ")
    unload = asyncio.create_task(client.post("/v1/models/a/unload"))
    await asyncio.sleep(0.05)
    assert not unload.done()
    text = first.decode() + (await resp.text())
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert "error" not in events[-1]
    assert [e["choices"][0]["finish_reason"] for e in events][-1] == "length"
    answer = await unload
    assert answer.status == 200 and (await answer.json())["status"] == "unloaded"
    assert (await models(client))["a"]["status"] == "unloaded"


async def test_load_and_unload_by_hand(client):
    resp = await client.post("/v1/models/b/load")
    assert resp.status == 200 and (await resp.json())["status"] == "loaded"
    resp = await client.post("/v1/models/b/unload")
    assert resp.status == 200 and (await resp.json())["status"] == "unloaded"
    resp = await client.post("/v1/models/nope/load")
    assert resp.status == 404


async def test_a_model_idle_past_its_keep_alive_unloads(client):
    assert (await complete(client, "c"))["model"] == "c"
    assert (await models(client))["c"]["status"] == "loaded"
    entry = client.app[REGISTRY].entries["c"]
    await wait_until(lambda: entry.state is None, timeout_s=10, what="c unloaded when idle")
    assert (await models(client))["c"]["status"] == "unloaded"


async def test_every_api_reaches_the_model_it_names(client):
    ids = {}
    for model in ("smol", "a"):
        resp = await client.post("/tokenize", json={"model": model, "prompt": "hello"})
        assert resp.status == 200
        ids[model] = (await resp.json())["tokens"]
    assert ids["smol"] != ids["a"]  # the embedded tokenizer against the byte tokenizer
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    resp = await client.post("/v1/chat/completions", json={**chat, "model": "smol"})
    assert resp.status == 200 and (await resp.json())["model"] == "smol"
    resp = await client.post("/v1/messages", json={**chat, "model": "smol"})
    assert resp.status == 200 and (await resp.json())["model"] == "smol"
    body = {"model": "smol", "input": "hi", "max_output_tokens": 4}
    resp = await client.post("/v1/responses", json=body)
    assert resp.status == 200 and (await resp.json())["model"] == "smol"
    resp = await client.post("/v1/messages", json={**chat, "model": "nope"})
    assert resp.status == 404 and (await resp.json())["type"] == "error"  # Anthropic's envelope


async def test_concurrent_requests_for_models_that_do_not_fit_together_all_finish(client):
    names = ["a", "b", "a", "b", "smol"]
    bodies = await asyncio.wait_for(
        asyncio.gather(*(complete(client, n) for n in names)), timeout=120
    )
    assert [b["model"] for b in bodies] == names
    texts = [b["choices"][0]["text"] for b in bodies]
    assert texts[0] == texts[2] and texts[1] == texts[3]  # each model's greedy answer, twice
    assert texts[0] != texts[1]
