"""The per-key view's rows, from /v1/stats "keys" (NAME -> priority, requests, 429s, running,
tokens and summed queue time of the requests made with that API key; "anonymous" for requests
without one). Pure Python, no Textual."""

from __future__ import annotations

from dataclasses import dataclass

from tui import format as fmt

PRIORITY_ORDER = ("interactive", "batch")
"""Classes in the order the table lists them (the scheduler serves them in this order)."""
COLUMNS = ("key", "class", "reqs", "429", "run", "prompt", "gen", "queued")
KEY_WIDTH = 16
"""Longest key name shown whole; longer ones are cut with an ellipsis."""


@dataclass(frozen=True)
class KeyRow:
    """One API key's line of the per-key table."""

    name: str
    priority: str
    requests: int | None
    rejected: int | None
    """Requests refused with 429 (a limit of the key, or the server's queue)."""
    running: int | None
    prompt_tokens: int | None
    generation_tokens: int | None
    queue_s: float | None
    """Arrival to first scheduled, summed over the key's finished requests."""

    def cells(self) -> tuple[str, ...]:
        return (
            fmt.short_id(self.name, KEY_WIDTH),
            self.priority,
            fmt.count(self.requests),
            fmt.count(self.rejected),
            fmt.integer(self.running),
            fmt.count(self.prompt_tokens),
            fmt.count(self.generation_tokens),
            fmt.seconds(self.queue_s),
        )

    @property
    def tokens(self) -> float:
        return (fmt.num(self.prompt_tokens) or 0) + (fmt.num(self.generation_tokens) or 0)


def key_rows(doc: dict) -> list[KeyRow] | None:
    """The rows, interactive keys first, then by tokens served (most first); None when the
    server sends no per-key section."""
    keys = doc.get("keys")
    if not isinstance(keys, dict):
        return None
    out = []
    for name, entry in keys.items():
        e = entry if isinstance(entry, dict) else {}
        out.append(
            KeyRow(
                name=str(name),
                priority=str(e.get("priority") or fmt.NA),
                requests=e.get("requests_total"),
                rejected=e.get("rejected_total"),
                running=e.get("running"),
                prompt_tokens=e.get("prompt_tokens_total"),
                generation_tokens=e.get("generation_tokens_total"),
                queue_s=fmt.num(e.get("queue_seconds_total")),
            )
        )
    rank = {p: i for i, p in enumerate(PRIORITY_ORDER)}
    return sorted(out, key=lambda r: (rank.get(r.priority, len(rank)), -r.tokens, r.name))


def select_keys(rows: list[KeyRow], text: str) -> list[KeyRow]:
    """Rows whose key name or class starts with the filter text."""
    f = text.strip().lower()
    return [r for r in rows if not f or r.name.lower().startswith(f) or r.priority.startswith(f)]
