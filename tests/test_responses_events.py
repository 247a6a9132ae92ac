"""The Responses API's stream events, without a model: for every split of a scripted output
(reasoning, text, two tool calls) into deltas, the events assemble, as a client assembles them,
into the output items of the whole response; and the response store's bounds and key scopes."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.server.chat_output import ChatOutput
from appliance.server.responses_api.events import OutputStream, Sequencer
from appliance.server.responses_api.store import ResponseStore

CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
)
SCRIPT = "<think>\nThe user asks twice.\n</think>\n\nLooking both up.\n" + CALLS
OUTPUT = ChatOutput(reasoning=True, tool_parser="hermes")


def counter():
    numbers = itertools.count()
    return lambda prefix: f"{prefix}_{next(numbers)}"


def run(chunks: list[str], output: ChatOutput = OUTPUT, complete: bool = True):
    """(events, items) of an output that arrives in `chunks`, as the route runs it."""
    stream, chat, seq = OutputStream(counter()), output.stream(), Sequencer()
    events = []
    for chunk in chunks:
        events += [seq(e) for e in stream.feed(chat.feed(chunk))]
    events += [seq(e) for e in stream.feed(chat.finish()) + stream.finish(complete)]
    return events, stream.items


def assemble(events: list[dict]) -> list[dict]:
    """The output items a client builds from the events alone (as openai's stream helper)."""
    items: dict[int, dict] = {}
    for e in events:
        kind, i = e["type"], e.get("output_index")
        if kind == "response.output_item.added":
            assert i not in items
            items[i] = json.loads(json.dumps(e["item"]))
        elif kind == "response.content_part.added":
            items[i]["content"].append(dict(e["part"]))
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            assert e["item_id"] == items[i]["id"]
            items[i]["content"][e["content_index"]]["text"] += e["delta"]
        elif kind == "response.function_call_arguments.delta":
            items[i]["arguments"] += e["delta"]
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert items[i]["content"][e["content_index"]]["text"] == e["text"]
        elif kind == "response.function_call_arguments.done":
            assert items[i]["arguments"] == e["arguments"] and items[i]["name"] == e["name"]
        elif kind == "response.output_item.done":
            done = e["item"]
            assert (done["id"], done["type"]) == (items[i]["id"], items[i]["type"])
            assert {**items[i], "status": done["status"]} == done
            items[i] = done
    return [items[i] for i in sorted(items)]


def without_call_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "call_id"} for item in items]


def test_the_whole_output_makes_reasoning_a_message_and_two_calls():
    events, items = run([SCRIPT])
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call", "function_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "The user asks twice."}]
    assert items[1]["content"][0]["text"] == "Looking both up."
    assert [(c["name"], json.loads(c["arguments"])) for c in items[2:]] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "CET"}),
    ]
    assert all(i["status"] == "completed" for i in items)
    assert items[2]["call_id"].startswith("call_") and items[2]["call_id"] != items[3]["call_id"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert assemble(events) == items
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    ]


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(1, len(SCRIPT) - 1), max_size=40))
def test_every_split_assembles_to_the_whole_response(cuts):
    bounds = [0, *sorted(cuts), len(SCRIPT)]
    chunks = [SCRIPT[a:b] for a, b in zip(bounds, bounds[1:])]
    events, items = run(chunks)
    assert assemble(events) == items
    assert without_call_ids(items) == without_call_ids(run([SCRIPT])[1])


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60), st.sets(st.integers(1, 59), max_size=10))
def test_plain_text_streams_as_one_message(text, cuts):
    bounds = [0, *sorted(c for c in cuts if c < len(text)), len(text)]
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    events, items = run(chunks, ChatOutput())
    assert assemble(events) == items
    if text:
        (item,) = items
        assert item["type"] == "message" and item["content"][0]["text"] == text
    else:
        assert items == [] and events == []


def test_an_output_cut_short_leaves_its_last_item_incomplete():
    _, items = run([SCRIPT[:50]], complete=False)
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert [i["status"] for i in items] == ["completed", "incomplete"]


# --- the store --------------------------------------------------------------------------------
def _response(i: int, size: int = 10) -> dict:
    return {"id": f"resp_{i}", "output": "x" * size}


def test_the_store_keeps_each_keys_responses_apart():
    store = ResponseStore()
    assert store.put("alice", _response(1), [{"type": "message"}])
    assert store.get("alice", "resp_1").conversation == [{"type": "message"}]
    assert store.get("bob", "resp_1") is None
    assert not store.delete("bob", "resp_1") and store.get("alice", "resp_1") is not None
    assert store.delete("alice", "resp_1") and store.get("alice", "resp_1") is None
    assert store.num_bytes == 0


def test_the_store_drops_the_least_recently_used_past_its_count_and_bytes():
    store = ResponseStore(max_responses=3, max_bytes=10_000)
    for i in range(3):
        store.put("k", _response(i), [])
    store.get("k", "resp_0")  # used: now the newest
    store.put("k", _response(3), [])
    assert [store.get("k", f"resp_{i}") is not None for i in range(4)] == [True, False, True, True]
    store.put("k", _response(4, size=9_900), [])  # room for it and one more at most
    assert store.num_bytes <= 10_000 and len(store) <= 2
    assert store.get("k", "resp_4") is not None and store.get("k", "resp_2") is None
    assert not store.put("k", _response(5, size=20_000), [])  # over the limit alone: not kept
    assert store.get("k", "resp_4") is not None
