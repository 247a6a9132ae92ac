"""What the dashboard shows, derived from /v1/stats documents: the connection state, the
sparkline histories, and the request rows with their sort keys. Pure Python, no Textual."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tui import format as fmt

HISTORY_LEN = 120
"""Samples kept per sparkline (about 30 s at the stream's four updates a second)."""


@dataclass(frozen=True)
class Connection:
    """The link to the server: connecting, connected or disconnected (since when, and why)."""

    state: str = "connecting"
    since: float | None = None
    reason: str | None = None

    @property
    def is_connected(self) -> bool:
        return self.state == "connected"


@dataclass(frozen=True)
class View:
    """One stats document plus the recent history of the figures drawn as sparklines."""

    doc: dict
    kv_perc: tuple[float, ...] = ()
    waiting: tuple[float, ...] = ()
    running: tuple[float, ...] = ()
    gen_tps: tuple[float, ...] = ()
    hit_perc: tuple[float, ...] = ()
    """The prefix cache's hit rate over the server's last minute (0 while it looked up none)."""

    def get(self, *path: str) -> object:
        """doc[path[0]][path[1]]..., or None where any step is missing."""
        node: object = self.doc
        for key in path:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        return node


@dataclass
class History:
    """Ring buffers behind the sparklines; `push` returns the View of the newest document."""

    size: int = HISTORY_LEN
    _series: dict[str, deque[float]] = field(default_factory=dict)

    def push(self, doc: dict) -> View:
        """Take in a document's figures; the View of it with the histories so far."""
        view = View(doc)
        samples = {
            "kv_perc": view.get("engine", "kv_usage_perc"),
            "waiting": view.get("engine", "num_waiting"),
            "running": view.get("engine", "num_running"),
            "gen_tps": view.get("throughput", "generation_tokens_per_s"),
            "hit_perc": view.get("kv", "prefix_cache", "hit_rate_perc"),
        }
        series = {}
        for name, value in samples.items():
            ring = self._series.setdefault(name, deque(maxlen=self.size))
            ring.append(fmt.num(value) or 0.0)
            series[name] = tuple(ring)
        return View(doc, **series)

    def view(self, doc: dict) -> View:
        """The View of `doc` with the histories as they stand, taking nothing in."""
        return View(doc, **{name: tuple(ring) for name, ring in self._series.items()})


@dataclass(frozen=True)
class Row:
    """One line of the request table."""

    id: str
    state: str
    prompt_tokens: int | None
    cached_tokens: int | None
    """Of prompt_tokens, those the prefix cache held."""
    completion_tokens: int | None
    queue_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    kv_blocks: int | None
    num_preemptions: int | None
    num_images: int | None
    """Images in the prompt; their encoder time is in the trace (images_encoded)."""
    finish: str
    order: int
    """Position in the server's list (running first, then the newest finished)."""
    out: str = ""
    """What the output is held to (out_mark): json, obj, rx, ch, gr, call, tool; "" for free."""

    def cells(self, id_width: int, columns: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The cells of `columns` (all of COLUMNS when empty), in that order."""
        cells = {
            "id": fmt.short_id(self.id, id_width),
            "state": self.state,
            "out": self.out,
            "prompt": fmt.integer(self.prompt_tokens),
            "cached": fmt.integer(self.cached_tokens),
            "gen": fmt.integer(self.completion_tokens),
            "queue": fmt.seconds(self.queue_s),
            "ttft": fmt.seconds(self.ttft_s),
            "tpot": fmt.seconds(self.tpot_s),
            "kv": fmt.integer(self.kv_blocks),
            "pre": fmt.integer(self.num_preemptions),
            "img": fmt.integer(self.num_images) if self.num_images else "",
            "finish": self.finish,
        }
        return tuple(cells[c] for c in columns or COLUMNS)


COLUMNS = (
    "id",
    "state",
    "out",
    "prompt",
    "cached",
    "gen",
    "queue",
    "ttft",
    "tpot",
    "kv",
    "pre",
    "img",
    "finish",
)
WIDE_ONLY = ("out", "cached", "img")
"""Columns left out of a narrow table (80 columns), where they would push `finish` off."""


def columns(wide: bool) -> tuple[str, ...]:
    """The request table's columns at a wide or a narrow panel width."""
    return COLUMNS if wide else tuple(c for c in COLUMNS if c not in WIDE_ONLY)


SORTS: dict[str, Callable[[Row], object]] = {
    "live": lambda r: -r.order,
    "state": lambda r: r.state,
    "out": lambda r: r.out,
    "prompt": lambda r: r.prompt_tokens or 0,
    "cached": lambda r: r.cached_tokens or 0,
    "gen": lambda r: r.completion_tokens or 0,
    "queue": lambda r: r.queue_s or 0.0,
    "ttft": lambda r: r.ttft_s or 0.0,
    "tpot": lambda r: r.tpot_s or 0.0,
    "kv": lambda r: r.kv_blocks or 0,
    "pre": lambda r: r.num_preemptions or 0,
    "img": lambda r: r.num_images or 0,
    "id": lambda r: r.id,
}
"""Sort orders `s` cycles through; each sorts largest first (`live` = the server's order)."""
FINAL_STATES = ("finished", "error", "timeout", "cancelled")


def display_state(item: dict) -> str:
    """The server says running from admission on; a request with no queue time and no KV
    blocks yet is still waiting for the engine."""
    state = str(item.get("state") or "?")
    if state in ("queued", "running") and item.get("queue_s") is None:
        return "running" if (fmt.num(item.get("kv_blocks")) or 0) > 0 else "waiting"
    return state


OUT_MARKS = {
    "json_schema": "json",
    "json_object": "obj",
    "regex": "rx",
    "choice": "ch",
    "grammar": "gr",
    "tool_call": "call",
}
"""The `out` column's mark for each grammar kind the server names in a row's `structured`
(tool_call: a call forced by tool_choice)."""
TOOLS_MARK = "tool"
"""The `out` mark of a request that sent tools and leaves the model free to call them."""


def out_mark(item: dict) -> str:
    """The `out` cell: the grammar's mark, `tool` for tools sent with the output left free,
    `json+t` and the like for both; "" for an unconstrained request without tools."""
    kind = item.get("structured")
    mark = OUT_MARKS.get(kind, str(kind)[:4]) if kind else ""
    if item.get("tools") is True and kind != "tool_call":
        return f"{mark}+t" if mark else TOOLS_MARK
    return mark


def finish_text(item: dict) -> str:
    reasons = [r for r in item.get("finish_reasons") or [] if r]
    if reasons:
        return ",".join(dict.fromkeys(reasons))
    if item.get("http_status") and item.get("state") in FINAL_STATES[1:]:
        return str(item["http_status"])
    return ""


def rows(doc: dict) -> list[Row]:
    out = []
    for order, item in enumerate(doc.get("requests") or []):
        if not isinstance(item, dict) or "id" not in item:
            continue
        out.append(
            Row(
                id=str(item["id"]),
                state=display_state(item),
                prompt_tokens=item.get("prompt_tokens"),
                cached_tokens=item.get("cached_tokens"),
                completion_tokens=item.get("completion_tokens"),
                queue_s=fmt.num(item.get("queue_s")),
                ttft_s=fmt.num(item.get("ttft_s")),
                tpot_s=fmt.num(item.get("tpot_s")),
                kv_blocks=item.get("kv_blocks"),
                num_preemptions=item.get("num_preemptions"),
                num_images=item.get("images"),
                finish=finish_text(item),
                order=order,
                out=out_mark(item),
            )
        )
    return out


def select(all_rows: list[Row], state_filter: str, sort: str, reverse: bool) -> list[Row]:
    """Rows whose state, id or out mark starts with the filter, largest first by `sort`."""
    f = state_filter.strip().lower()
    kept = [
        r
        for r in all_rows
        if not f or r.state.startswith(f) or r.id.startswith(f) or r.out.startswith(f)
    ]
    return sorted(kept, key=SORTS[sort], reverse=not reverse)
