"""/v1/stats and /metrics with two registered models (one path under two names, each served by
a fake engine): each model's row (status, memory, requests, last request), each loaded model's
own engine sections under by_model (none for an unloaded one), and a model_name label on every
/metrics series."""

from __future__ import annotations

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from appliance.server import create_app
from appliance.server.app_keys import STATE
from appliance.server.model_stats import ENGINE_SECTIONS
from appliance.server.state import Phase
from appliance.settings import ServeSettings
from engine.models.embedded import default_model_path
from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client
from tests.support.tui_model_fakes import make_models_doc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")
PROMPT = {"prompt": "hello", "max_tokens": 3}


def fake_loader(settings: ServeSettings) -> FakeEngine:
    return FakeEngine()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    path = default_model_path()
    settings = ServeSettings(
        model=[f"x={path}", f"y={path}"],
        models={"x": {"pinned": True}},
        device="cpu",
        warmup=False,
        log_level="warning",
    )
    app = create_app(settings, loader=fake_loader)
    async with TestClient(TestServer(app)) as client:
        front = app[STATE]
        await wait_until(lambda: front.phase is Phase.READY, timeout_s=60, what="start-up")
        yield client


async def stats(client: TestClient) -> dict:
    resp = await client.get("/v1/stats")
    assert resp.status == 200
    return await resp.json()


async def complete(client: TestClient, model: str) -> None:
    resp = await client.post("/v1/completions", json={**PROMPT, "model": model})
    assert resp.status == 200, await resp.text()


async def test_an_unloaded_model_has_a_row_and_no_engine_sections(client):
    doc = await stats(client)
    rows = {m["name"]: m for m in doc["models"]}
    assert [m["name"] for m in doc["models"]] == ["x", "y"]
    assert rows["x"]["status"] == "loaded" and rows["y"]["status"] == "unloaded"
    assert rows["x"]["memory_bytes"] > 0 and rows["y"]["error"] is None
    assert rows["y"]["requests_total"] == 0 and rows["y"]["last_request_at"] is None
    assert list(doc["by_model"]) == ["x"]
    assert tuple(doc["by_model"]["x"]) == ENGINE_SECTIONS
    assert doc["by_model"]["x"]["config"]["max_num_seqs"] == 4


async def test_each_loaded_model_carries_its_own_figures(client):
    await complete(client, "y")  # loads y
    for _ in range(2):
        await complete(client, "x")
    doc = await stats(client)
    rows = {m["name"]: m for m in doc["models"]}
    assert {n: r["status"] for n, r in rows.items()} == {"x": "loaded", "y": "loaded"}
    assert (rows["x"]["requests_total"], rows["x"]["finished_total"]) == (2, 2)
    assert (rows["y"]["requests_total"], rows["y"]["finished_total"]) == (1, 1)
    assert rows["x"]["last_request_at"] > rows["y"]["last_request_at"]
    x, y = doc["by_model"]["x"], doc["by_model"]["y"]
    assert (x["model"], y["model"]) == ("x", "y")
    assert len(x["requests"]) == 2 and len(y["requests"]) == 1
    assert len(doc["requests"]) == 3  # the top level lists every model's requests
    assert x["latency"]["e2e_s"]["count"] == 2 and y["latency"]["e2e_s"]["count"] == 1
    assert x["engine"]["kv_blocks_total"] == 256
    assert doc["model"] == "x"  # the top level is the model used last


async def test_every_metrics_series_names_its_model(client):
    await complete(client, "x")
    await complete(client, "y")
    text = await (await client.get("/metrics")).text()
    families = list(text_string_to_metric_families(text))
    samples = [s for f in families for s in f.samples]
    assert len(samples) > 50
    unlabelled = sorted({s.name for s in samples if "model_name" not in s.labels})
    assert unlabelled == []
    in_flight = {
        s.labels["model_name"] for s in samples if s.name == "appliance:requests_in_flight"
    }
    assert in_flight == {"x", "y"}
    key_models = {
        s.labels["model_name"] for s in samples if s.name == "appliance:key_requests_total"
    }
    assert key_models == {"x", "y"}
    for name in ("vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count"):
        assert {s.labels["model_name"] for s in samples if s.name == name} == {"x", "y"}


async def test_the_dashboards_fake_has_the_servers_shape(client):
    """tests/support/tui_model_fakes.py's rows and sections carry the real ones' keys."""
    real, fake = await stats(client), make_models_doc()
    assert {frozenset(m) for m in real["models"]} == {frozenset(m) for m in fake["models"]}
    for sections in (*real["by_model"].values(), *fake["by_model"].values()):
        assert tuple(sections) == ENGINE_SECTIONS
    assert set(real) == set(fake)


async def test_a_one_model_server_labels_every_series_too():
    async with fake_client(api_key=["alice:sk-alice-key"]) as one:
        auth = {"Authorization": "Bearer sk-alice-key"}
        resp = await one.post("/v1/completions", json=PROMPT, headers=auth)
        assert resp.status == 200
        text = await (await one.get("/metrics", headers=auth)).text()
        doc = await (await one.get("/v1/stats", headers=auth)).json()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert {s.labels.get("model_name") for s in samples} == {"fake-model"}
    assert any(s.name == "appliance:key_requests_total" for s in samples)
    assert doc["models"] is None and doc["by_model"] is None
