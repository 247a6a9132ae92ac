"""The models table's rows and the one-model view of a stats document. With several models,
/v1/stats lists each one ("models": status, memory, requests) and carries each loaded one's
engine sections by name ("by_model"); the dashboard's panels show one model's sections at a
time. Pure Python, no Textual."""

from __future__ import annotations

from dataclasses import dataclass

from tui import format as fmt

MODEL_SECTIONS = (
    "model",
    "model_params",
    "device",
    "config",
    "plan",
    "engine",
    "kv",
    "queue",
    "throughput",
    "latency",
    "requests_in_flight",
    "requests",
    "traces",
)
"""The keys of one model's engine sections, as the server sends them under "by_model" (the
server's ENGINE_SECTIONS is this list: appliance/server/model_stats.py)."""
COLUMNS = ("model", "status", "memory", "run", "served", "last used")
STATUSES = ("loaded", "loading", "unloaded", "failed")
NAME_WIDTH = 24
"""Longest model name shown whole; longer ones are cut with an ellipsis."""


@dataclass(frozen=True)
class ModelRow:
    """One line of the models table."""

    name: str
    status: str
    """loaded, loading, unloaded or failed (unloading reads as loaded until it ends)."""
    memory_bytes: int | None
    """Planned bytes: of its load, or before one, its plan made ahead or its weights' size."""
    running: int | None
    """Requests in flight on it now."""
    served: int | None
    """Requests it finished."""
    last_request_at: float | None
    """Wall time of its last admitted request (None: none yet)."""
    error: str | None = None
    pinned: bool = False

    def cells(self, now: float, selected: bool) -> tuple[str, ...]:
        """The row's cells; the model the panels show is marked with a leading `>`."""
        mark = ">" if selected else " "
        pin = "*" if self.pinned else ""
        return (
            f"{mark} {fmt.short_id(self.name, NAME_WIDTH)}{pin}",
            self.status,
            fmt.gib(self.memory_bytes),
            fmt.integer(self.running),
            fmt.count(self.served),
            last_used(self.last_request_at, now),
        )


def last_used(at: float | None, now: float) -> str:
    """`12.0s ago`, `never` before any request, n/a when the server does not say."""
    if at is None:
        return "never"
    t = fmt.num(at)
    return fmt.NA if t is None else f"{fmt.seconds(max(0.0, now - t))} ago"


def model_rows(doc: dict) -> list[ModelRow] | None:
    """The rows in the server's order; None for a server with one model (no "models")."""
    models = doc.get("models")
    if not isinstance(models, list):
        return None
    out = []
    for m in models:
        if not isinstance(m, dict) or "name" not in m:
            continue
        status = str(m.get("status") or fmt.NA)
        out.append(
            ModelRow(
                name=str(m["name"]),
                status=status,
                memory_bytes=m.get("memory_bytes"),
                running=m.get("requests"),
                served=m.get("finished_total"),
                last_request_at=fmt.num(m.get("last_request_at")),
                error=m.get("error"),
                pinned=bool(m.get("pinned")),
            )
        )
    return out


def default_model(doc: dict) -> str | None:
    """The model the panels show until one is chosen: the one asked for last; before any
    request, the only model, else the first loaded one, else the server's top-level model."""
    rows = model_rows(doc)
    if not rows:
        return None
    used = [r for r in rows if r.last_request_at is not None]
    if used:
        return max(used, key=lambda r: r.last_request_at).name
    if len(rows) == 1:
        return rows[0].name
    loaded = [r.name for r in rows if r.name in (doc.get("by_model") or {})]
    if loaded:
        return loaded[0]
    top = doc.get("model")
    return top if any(r.name == top for r in rows) else rows[0].name


def focus(doc: dict, name: str) -> dict:
    """The document as the panels read it for model `name`: its engine sections in place of
    the top level's; for a model with none (not loaded), those sections empty (the panels
    show n/a, the request table nothing) but for its own 429 and timeout counts."""
    sections = (doc.get("by_model") or {}).get(name)
    if not isinstance(sections, dict):
        row = next((m for m in doc.get("models") or [] if m.get("name") == name), {})
        queue = {k: row.get(k) for k in ("rejected_total", "timed_out_total")}
        sections = {
            **dict.fromkeys(MODEL_SECTIONS),
            "queue": queue,
            "requests": [],
            "traces": [],
        }
    return {**doc, **sections, "model": name}


def not_loaded(doc: dict) -> str | None:
    """Why the shown model has no figures ("unloaded", "loading", "failed: why"), or None
    when it has them (or the server serves one model)."""
    name = doc.get("model")
    rows = doc.get("models")
    if not isinstance(rows, list) or name in (doc.get("by_model") or {}):
        return None
    row = next((m for m in rows if isinstance(m, dict) and m.get("name") == name), {})
    status = str(row.get("status") or "unloaded")
    return f"{status}: {row['error']}" if row.get("error") else status


def step(names: list[str], current: str | None, offset: int) -> str | None:
    """The model `offset` places after `current` in the table's order (wrapping)."""
    if not names:
        return None
    if current not in names:
        return names[0]
    return names[(names.index(current) + offset) % len(names)]
