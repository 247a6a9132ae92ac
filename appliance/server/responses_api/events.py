"""The Responses API's output items and stream events, built from the chat text deltas the
generation path already produces (chat_output.ChatStream: {"reasoning_content"}, {"content"},
{"tool_calls"}). Pure: no I/O, no model, so any split of an output into deltas can be checked
to assemble into the same response (tests/test_responses_events.py).

Each change of kind opens a new output item: reasoning (a `reasoning` item with one
`reasoning_text` part), content (a `message` with one `output_text` part), each tool call (a
`function_call`). An item is closed with its `.done` events when the next one opens or the
output ends; the items in `OutputStream.items` are the response's `output`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

IdMaker = Callable[[str], str]
"""prefix -> a fresh id with that prefix ("msg", "rs", "fc", "resp")."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class OutputStream:
    """Chat deltas in, Responses events out; `items` holds the output items as they stand."""

    def __init__(self, make_id: IdMaker = new_id) -> None:
        self.make_id = make_id
        self.items: list[dict] = []
        self._kind: object = None
        """What the open item holds: "reasoning", "message", ("call", index) or None."""

    def feed(self, deltas: list[dict]) -> list[dict]:
        """The events for these deltas (without sequence numbers)."""
        events: list[dict] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                events += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
        return events

    def finish(self, complete: bool = True) -> list[dict]:
        """Close the open item: "completed", or "incomplete" when the output was cut short."""
        return self._close("completed" if complete else "incomplete")

    # --- items ------------------------------------------------------------------------------
    def _open(self, kind: object, item: dict) -> list[dict]:
        events = self._close("completed")
        self._kind = kind
        self.items.append(item)
        return events + [self._item_event("response.output_item.added", item)]

    def _text(self, kind: str, text: str) -> list[dict]:
        events: list[dict] = []
        if self._kind != kind:
            if kind == "message":
                item = {"id": self.make_id("msg"), "type": "message", "role": "assistant"}
                item.update(status="in_progress", content=[])
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"id": self.make_id("rs"), "type": "reasoning", "summary": []}
                item.update(content=[], status="in_progress")
                part = {"type": "reasoning_text", "text": ""}
            events += self._open(kind, item)
            item["content"].append(part)
            events.append(self._part_event("response.content_part.added", dict(part)))
        self.items[-1]["content"][0]["text"] += text
        name = "output_text" if kind == "message" else "reasoning_text"
        event = self._part_event(f"response.{name}.delta", None)
        event["delta"] = text
        if kind == "message":
            event["logprobs"] = []
        return events + [event]

    def _call(self, call: dict) -> list[dict]:
        events: list[dict] = []
        function = call.get("function") or {}
        if call.get("id") is not None:
            item = {"id": self.make_id("fc"), "type": "function_call", "call_id": call["id"]}
            item.update(name=function.get("name") or "", arguments="", status="in_progress")
            events += self._open(("call", call["index"]), item)
        fragment = function.get("arguments") or ""
        if fragment and self._kind == ("call", call["index"]):
            self.items[-1]["arguments"] += fragment
            events.append(self._event("response.function_call_arguments.delta", delta=fragment))
        return events

    def _close(self, status: str) -> list[dict]:
        kind, self._kind = self._kind, None
        if kind is None:
            return []
        item = self.items[-1]
        item["status"] = status
        if isinstance(kind, tuple):
            done = self._event("response.function_call_arguments.done")
            done.update(name=item["name"], arguments=item["arguments"])
            return [done, self._item_event("response.output_item.done", item)]
        part = item["content"][0]
        name = "output_text" if kind == "message" else "reasoning_text"
        done = self._part_event(f"response.{name}.done", None)
        done["text"] = part["text"]
        if kind == "message":
            done["logprobs"] = []
        return [
            done,
            self._part_event("response.content_part.done", dict(part)),
            self._item_event("response.output_item.done", item),
        ]

    # --- events -----------------------------------------------------------------------------
    def _event(self, kind: str, **fields) -> dict:
        index = len(self.items) - 1
        return {"type": kind, "item_id": self.items[index]["id"], "output_index": index, **fields}

    def _item_event(self, kind: str, item: dict) -> dict:
        return {"type": kind, "output_index": len(self.items) - 1, "item": _copy(item)}

    def _part_event(self, kind: str, part: dict | None) -> dict:
        event = self._event(kind, content_index=0)
        if part is not None:
            event["part"] = part
        return event


def _copy(item: dict) -> dict:
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out


class Sequencer:
    """Numbers a stream's events from 0, in the order they are sent."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, event: dict) -> dict:
        event["sequence_number"] = self.next
        self.next += 1
        return event
