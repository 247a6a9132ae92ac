"""Stored responses (`store: true`, the default): kept in memory, per API key, least recently
used first out once the count or the bytes pass their limits. A restart forgets them all.

Each entry holds the response object (for GET /v1/responses/{id}) and the conversation it
ended (its input items, a previous response's included, then its output items), which is what
`previous_response_id` puts before a new request's input. A key sees only its own entries:
another key's id is a 404, as an unknown one is.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

MAX_STORED_RESPONSES = 1000
"""Most responses kept, all keys together."""
MAX_STORED_BYTES = 64 << 20
"""Most bytes kept (the JSON of each response and its conversation), all keys together."""


@dataclass
class Stored:
    response: dict
    conversation: list[dict]
    size: int


class ResponseStore:
    def __init__(
        self, max_responses: int = MAX_STORED_RESPONSES, max_bytes: int = MAX_STORED_BYTES
    ) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[tuple[str, str], Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, response: dict, conversation: list[dict]) -> bool:
        """Keep a response for `owner` (a key's name); False when it alone is over the bytes
        limit (it is not kept). Older entries make room."""
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        if size > self.max_bytes:
            return False
        self.delete(owner, response["id"])
        self._entries[(owner, response["id"])] = Stored(response, conversation, size)
        self.num_bytes += size
        while len(self._entries) > self.max_responses or self.num_bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.num_bytes -= old.size
        return True

    def get(self, owner: str, response_id: str) -> Stored | None:
        entry = self._entries.get((owner, response_id))
        if entry is not None:
            self._entries.move_to_end((owner, response_id))
        return entry

    def delete(self, owner: str, response_id: str) -> bool:
        entry = self._entries.pop((owner, response_id), None)
        if entry is None:
            return False
        self.num_bytes -= entry.size
        return True
