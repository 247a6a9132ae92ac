"""Request bodies that Codex CLI and the openai-agents SDK send to /v1/responses (written from
the public Responses API reference; docs/agents-codex.md shows them), replayed against the
server: each is served, whole or streamed, and a tool call comes back as a function_call item."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client

DATA = Path(__file__).parent / "data" / "responses_requests"
BODIES = sorted(DATA.glob("*.json"))
SHELL_CALL = '<tool_call>\n{"name": "shell", "arguments": {"command": ["ls"]}}\n</tool_call>'


def events(text: str) -> list[dict]:
    return [
        json.loads(line[len("data: ") :]) for line in text.split("\n") if line.startswith("data: ")
    ]


@pytest.mark.parametrize("path", BODIES, ids=[p.stem for p in BODIES])
async def test_a_recorded_body_is_served(path):
    engine = FakeEngine(script="Done: README.md, src, tests.", max_model_len=1024)
    async with fake_client(engine, tool_parser="hermes") as client:
        body = {**json.loads(path.read_text()), "model": "fake-model"}
        r = await client.post("/v1/responses", json=body)
        assert r.status == 200, await r.text()
        if body.get("stream"):
            final = events(await r.text())[-1]
            assert final["type"] == "response.completed"
            response = final["response"]
        else:
            response = await r.json()
        assert response["output_text"] == "Done: README.md, src, tests."
        assert response["store"] == body.get("store", True)


async def test_codex_gets_its_shell_call_back():
    body = json.loads((DATA / "codex_first_turn.json").read_text())
    engine = FakeEngine(script=SHELL_CALL, max_model_len=1024)
    async with fake_client(engine, tool_parser="hermes") as client:
        r = await client.post("/v1/responses", json={**body, "model": "fake-model"})
        stream = events(await r.text())
        done = [e["item"] for e in stream if e["type"] == "response.output_item.done"]
        assert [(i["type"], i["name"]) for i in done] == [("function_call", "shell")]
        assert json.loads(done[0]["arguments"]) == {"command": ["ls"]}
        assert stream[-1]["response"]["output"] == done
