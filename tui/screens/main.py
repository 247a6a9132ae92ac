"""MainScreen: the dashboard: header, the models table (several models), the four gauge panels
(KV cache, queue, throughput, GPU), the request table, the per-key table and, when the server
runs in this process, its log."""

from __future__ import annotations

from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer

from tui.model import Connection, View
from tui.widgets.gpu import GpuPanel
from tui.widgets.header import HeaderBar
from tui.widgets.keys import KeysPanel
from tui.widgets.kv import KVPanel
from tui.widgets.logpanel import LogPanel
from tui.widgets.models import ModelsPanel
from tui.widgets.queue import QueuePanel
from tui.widgets.requests import RequestsPanel
from tui.widgets.throughput import ThroughputPanel


class MainScreen(Screen):
    """Panels in a 2x2 grid below 160 columns, in one row from 160 columns on; from 30 rows on
    they are a line taller (the KV panel's largest holders by id) and the per-key table sits
    below the requests; `k` swaps it with the request table below 30 rows, hides it from 30."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (160, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        Binding("S", "reverse", "Reverse", show=False),
        Binding("k", "keys", "Keys"),
        Binding("o", "toggle_log", "Log", show=False),
    ]

    view: reactive[View | None] = reactive(None, always_update=True)
    connection: reactive[Connection] = reactive(Connection())
    paused: reactive[bool] = reactive(False)

    def __init__(self, url: str, clock: Callable[[], float], log_path: str | None = None) -> None:
        super().__init__(id="main")
        self.url, self.clock, self.log_path = url, clock, log_path
        self.log_panel = LogPanel(log_path, id="log") if log_path is not None else None

    def compose(self) -> ComposeResult:
        yield HeaderBar(self.url, self.clock, id="header").data_bind(
            MainScreen.view, MainScreen.connection, MainScreen.paused
        )
        yield ModelsPanel(id="models").data_bind(MainScreen.view)
        with Grid(id="panels"):
            yield KVPanel(id="kv").data_bind(MainScreen.view)
            yield QueuePanel(id="queue").data_bind(MainScreen.view)
            yield ThroughputPanel(id="throughput").data_bind(MainScreen.view)
            yield GpuPanel(id="gpu").data_bind(MainScreen.view)
        yield RequestsPanel(id="requests").data_bind(MainScreen.view)
        yield KeysPanel(id="keys").data_bind(MainScreen.view)
        if self.log_panel is not None:
            yield self.log_panel
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#requests-table").focus()

    @property
    def requests(self) -> RequestsPanel:
        return self.query_one(RequestsPanel)

    @property
    def keys(self) -> KeysPanel:
        return self.query_one(KeysPanel)

    def action_filter(self) -> None:
        if self.keys.has_focus_within:
            self.keys.open_filter()
        else:
            self.requests.open_filter()

    def action_keys(self) -> None:
        """Swap the per-key table in (or out): in place of the requests below 30 rows, hidden
        or shown from 30 rows on."""
        self.toggle_class("-swap")
        shown = self.has_class("-short") == self.has_class("-swap")
        self.query_one("#keys-table" if shown else "#requests-table").focus()

    def action_sort(self) -> None:
        self.requests.next_sort()

    def action_reverse(self) -> None:
        self.requests.reverse = not self.requests.reverse

    def action_toggle_log(self) -> None:
        if self.log_panel is not None:
            self.log_panel.display = not self.log_panel.display

    @on(ModelsPanel.Chosen)
    def _choose_model(self, event: ModelsPanel.Chosen) -> None:
        self.app.choose_model(event.name)

    @on(RequestsPanel.TraceRequested)
    def _open_trace(self, event: RequestsPanel.TraceRequested) -> None:
        self.app.open_trace(event.request_id)
