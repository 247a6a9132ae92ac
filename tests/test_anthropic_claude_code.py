"""The requests docs/agents-claude-code.md shows Claude Code sending, replayed against a server
(a fake engine that answers with a call of Claude Code's Bash tool): each is served, and the
answer is what the anthropic client's own types read, whole or as stream events."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from tests.support.fake_engine import FakeEngine
from tests.support.fake_server import fake_client

anthropic = pytest.importorskip("anthropic")
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent  # noqa: E402

DOC = Path(__file__).parent.parent / "docs" / "agents-claude-code.md"
REPLAYED = re.compile(r"```json replay=(\S+)\n(.*?)\n```", re.S)
SCRIPT = 'Listing.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
HEADERS = {
    "x-api-key": "sk-team-claude-code",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
}


def recorded() -> list[tuple[str, dict]]:
    return [(path, json.loads(body)) for path, body in REPLAYED.findall(DOC.read_text())]


def stream_events(text: str) -> list:
    """The (event, data) pairs of a Messages SSE body; each event line names its data's type."""
    out = []
    for chunk in text.strip().split("\n\n"):
        kind, data = chunk.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: ")
        event = json.loads(data[len("data: ") :])
        assert event["type"] == kind[len("event: ") :]
        out.append(event)
    return out


def test_the_doc_shows_every_kind_of_request():
    paths = [path for path, _ in recorded()]
    assert paths.count("/v1/messages") == 4 and "/v1/messages/count_tokens" in paths


async def test_claude_codes_requests_are_served():
    engine = FakeEngine(script=SCRIPT, max_model_len=2048, num_kv_blocks=1024)
    settings = dict(
        tool_parser="hermes",
        api_key=["claude:sk-team-claude-code"],
        model_alias=["claude-*=fake-model"],
    )
    events = TypeAdapter(RawMessageStreamEvent)
    async with fake_client(engine, **settings) as client:
        for path, body in recorded():
            r = await client.post(path, json=body, headers=HEADERS)
            assert r.status == 200, (path, await r.text())
            if path.endswith("count_tokens"):
                assert MessageTokensCount.model_validate(await r.json()).input_tokens > 10
            elif body.get("stream"):
                sent = stream_events(await r.text())
                assert sent[1] == {"type": "ping"}  # the client's types leave pings out
                parsed = [events.validate_python(e) for e in sent if e["type"] != "ping"]
                assert parsed[0].type == "message_start" and parsed[-1].type == "message_stop"
                (delta,) = [e for e in parsed if e.type == "message_delta"]
                calls = [e.content_block for e in parsed if e.type == "content_block_start"]
                calls = [(b.name, b.type) for b in calls if b.type == "tool_use"]
                if body.get("tools"):
                    assert delta.delta.stop_reason == "tool_use" and calls == [("Bash", "tool_use")]
                else:
                    assert delta.delta.stop_reason == "end_turn" and not calls
            else:
                message = Message.model_validate(await r.json())
                assert message.model == body["model"] and message.stop_reason == "end_turn"
                (text,) = message.content  # no tools sent: the markup is the model's text
                assert text.text == SCRIPT
