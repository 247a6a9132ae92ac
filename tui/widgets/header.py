"""HeaderBar: the top two lines: model (and, with several models, whether the one shown is
loaded), device, weight format, KV dtype, limits, uptime, health, and the connection
(connected, paused, or disconnected since when)."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from tui import format as fmt
from tui import models
from tui.model import Connection, View

HEALTH = {"ok": "OK", "loading": "LOADING", "draining": "DRAINING", "error": "ERROR"}


def params_text(doc: dict) -> str:
    """The model's parameters: "30.5B params, 3.35B active" with experts, "135M params" for a
    dense model, "params n/a" where /v1/stats has none."""
    params = doc.get("model_params") or {}
    total, active = fmt.params(params.get("total")), fmt.params(params.get("active"))
    if total == fmt.NA:
        return f"params {fmt.NA}"
    return f"{total} params" + (
        f", {active} active" if params.get("active") != params.get("total") else ""
    )


def weight_format(config: dict) -> str:
    dtype = str(config.get("dtype") or fmt.NA)
    quant = config.get("quantization")
    return dtype if quant in (None, "none") else f"{quant} ({dtype})"


class HeaderBar(Static):
    """Two lines; bad news (unhealthy, disconnected, paused) in reverse video."""

    view: reactive[View | None] = reactive(None, always_update=True)
    connection: reactive[Connection] = reactive(Connection())
    paused: reactive[bool] = reactive(False)

    def __init__(self, url: str, clock: Callable[[], float], **kwargs) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.clock = clock

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)
        self._draw()

    def _tick(self) -> None:
        if not self.connection.is_connected:
            self._draw()

    def watch_view(self) -> None:
        self._draw()

    def watch_connection(self) -> None:
        self._draw()

    def watch_paused(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if not self.is_mounted:
            return
        view = self.view
        doc = view.doc if view else {}
        config = doc.get("config") or {}
        status = str(doc.get("status") or "")
        conn = self.connection
        top = Text(no_wrap=True, overflow="ellipsis")
        if conn.state == "disconnected":
            top.append(" DISCONNECTED ", "bold reverse")
        else:
            health = HEALTH.get(status, status.upper() or "…")
            top.append(f" {health} ", "bold" if status == "ok" else "bold reverse")
        top.append(" ")
        # The bold run ends with the space: a run that starts with one reads as joined to the
        # word before it where runs are taken apart (the SVG snapshots' <text> elements).
        top.append(str(doc.get("model") or "no model yet") + " ", "bold")
        absent = models.not_loaded(doc)
        if absent is not None:  # several models, and the one shown has no engine now
            top.append(f" NOT LOADED ({absent}) ", "bold reverse")
            top.append(" ")
        top.append(f"({params_text(doc)}) on {doc.get('device') or fmt.NA}")
        top.append(f" · weights {weight_format(config) if config else fmt.NA}")
        top.append(f" · KV {config.get('kv_cache_dtype') or fmt.NA}")
        self.update(Text("\n").join([top, self._second_line(doc, config)]))

    def _second_line(self, doc: dict, config: dict) -> Text:
        """The limits, uptime and URL; while disconnected, since when and why instead."""
        conn = self.connection
        line = Text(no_wrap=True, overflow="ellipsis")
        if conn.state == "disconnected" and conn.since is not None:
            ago = fmt.seconds(max(0.0, self.clock() - conn.since))
            line.append(f" disconnected since {fmt.clock(conn.since)} ({ago}) ", "bold reverse")
            line.append(f" {conn.reason or ''} · retrying {self.url}")
            return line
        if self.paused:
            line.append(" PAUSED ", "bold reverse")
            line.append(" ")
        line.append(f"max_model_len {fmt.integer(config.get('max_model_len'))}")
        line.append(f" · max_num_seqs {fmt.integer(config.get('max_num_seqs'))}")
        line.append(f" · up {fmt.uptime(doc.get('uptime_s'))} · ")
        if conn.state == "connecting":
            line.append(f"connecting to {self.url}…")
        else:
            line.append(self.url, "dim")
        return line
