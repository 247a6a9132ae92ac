"""DashboardApp and create_app: the Textual application shared by `appliance top`,
`appliance serve --tui` and the tests. It follows the stats stream in a worker, reconnects by
itself, and hands the latest View to whichever screens show it; with several models, the View
of the model chosen (`m`, or a row of the models table), each model with its own histories."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
from textual import work
from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive

from tui import models
from tui.model import Connection, History, View
from tui.screens.help import HelpScreen
from tui.screens.main import MainScreen
from tui.screens.plan import PlanScreen
from tui.screens.trace import TraceScreen
from tui.source import SourceError, StatsSource

DEFAULT_URL = "http://127.0.0.1:8000"


class DashboardApp(App):
    """The dashboard. `clock` gives the wall time (tests pin it); `retry_s` is the wait between
    reconnection attempts; `log_path` adds a log panel (the server runs in this process)."""

    CSS_PATH = "dashboard.tcss"
    TITLE = "appliance top"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("p", "pause", "Pause"),
        Binding("c", "plan", "Plan"),
        Binding("m", "next_model", "Model"),
        Binding("M", "previous_model", "Previous model", show=False),
        Binding("question_mark", "help", "Help"),
    ]

    view: reactive[View | None] = reactive(None, always_update=True)
    connection: reactive[Connection] = reactive(Connection())
    paused: reactive[bool] = reactive(False)
    model: reactive[str | None] = reactive(None)
    """The model the panels show, as chosen; None: the default (models.default_model)."""

    def __init__(
        self,
        source: StatsSource,
        *,
        clock: Callable[[], float] = time.time,
        retry_s: float = 1.0,
        log_path: str | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.clock = clock
        self.retry_s = retry_s
        self.log_path = log_path
        self.history = History()
        self.histories: dict[str, History] = {}
        """Each model's sparkline histories (several models)."""
        self.latest: View | None = None
        self.latest_doc: dict | None = None
        self.shown_doc: dict | None = None
        """The document behind the View shown (the one paused on, while paused)."""
        self.main = MainScreen(source.url, clock, log_path)

    def on_mount(self) -> None:
        self.push_screen(self.main)
        self._follow()

    async def on_unmount(self) -> None:
        await self.source.close()

    # --- the stats stream -----------------------------------------------------------------
    @work(exclusive=True, group="stats")
    async def _follow(self) -> None:
        """Read the stream for as long as the app runs; after a break, retry every retry_s."""
        while True:
            try:
                async for doc in self.source.stream():
                    if not self.connection.is_connected:
                        self.connection = Connection("connected", self.clock())
                    self.ingest(doc)
                reason = "the server closed the stream"
            except SourceError as exc:
                reason = str(exc)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                reason = _why(exc)
            if self.connection.state != "disconnected":
                self.connection = Connection("disconnected", self.clock(), reason)
            await asyncio.sleep(self.retry_s)

    def ingest(self, doc: dict) -> None:
        """Take in one stats document (the stream worker calls this; so can tests)."""
        had_models = self.has_models
        self.latest_doc = doc
        if models.model_rows(doc) is None:
            self.latest = self.history.push(doc)
        else:
            for name in doc.get("by_model") or {}:
                self.histories.setdefault(name, History()).push(models.focus(doc, name))
            self.latest = self._model_view(doc)
        if had_models != self.has_models:
            self.refresh_bindings()
        if not self.paused:
            self.shown_doc = doc
            self.view = self.latest

    @property
    def has_models(self) -> bool:
        """Whether the server serves several models (a registry)."""
        return self.latest_doc is not None and models.model_rows(self.latest_doc) is not None

    def shown_model(self, doc: dict) -> str | None:
        """The model whose figures the panels show for `doc`: the chosen one while the server
        lists it, else the default."""
        rows = models.model_rows(doc) or []
        if self.model is not None and any(r.name == self.model for r in rows):
            return self.model
        return models.default_model(doc)

    def _model_view(self, doc: dict) -> View:
        name = self.shown_model(doc)
        if name is None:
            return View(doc)
        focused = models.focus(doc, name)
        loaded = name in (doc.get("by_model") or {})
        return self.histories[name].view(focused) if loaded else View(focused)

    def choose_model(self, name: str) -> None:
        """Show `name`'s figures in the panels (a name the server does not list is ignored
        until it does)."""
        self.model = name

    def watch_model(self) -> None:
        if self.latest_doc is not None and models.model_rows(self.latest_doc) is not None:
            self.latest = self._model_view(self.latest_doc)
        if self.shown_doc is not None and models.model_rows(self.shown_doc) is not None:
            self.view = self._model_view(self.shown_doc)

    def watch_view(self, view: View | None) -> None:
        for screen in (self.main, *self.screen_stack):
            if isinstance(screen, MainScreen | PlanScreen):
                screen.view = view

    def watch_connection(self, connection: Connection) -> None:
        self.main.connection = connection

    def watch_paused(self, paused: bool) -> None:
        self.main.paused = paused
        if not paused and self.latest is not None:
            self.shown_doc = self.latest_doc
            self.view = self.latest

    # --- actions --------------------------------------------------------------------------
    def action_pause(self) -> None:
        self.paused = not self.paused

    def action_next_model(self) -> None:
        self._step_model(1)

    def action_previous_model(self) -> None:
        self._step_model(-1)

    def _step_model(self, offset: int) -> None:
        doc = self.shown_doc or self.latest_doc or {}
        names = [r.name for r in models.model_rows(doc) or []]
        name = models.step(names, self.shown_model(doc), offset)
        if name is not None:
            self.choose_model(name)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The model keys exist only while the server serves several models."""
        if action in ("next_model", "previous_model"):
            return self.has_models
        return True

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_plan(self) -> None:
        if not isinstance(self.screen, PlanScreen):
            plan = PlanScreen()
            plan.view = self.view
            self.push_screen(plan)

    def open_trace(self, request_id: str) -> None:
        self.push_screen(TraceScreen(self.source, request_id))

    # --- the log panel (serve --tui) ------------------------------------------------------
    def write_log(self, line: str) -> None:
        """Add a server log line to the log panel; call on the app's event loop."""
        if self.main.log_panel is not None:
            self.main.log_panel.write_line(line)


def _why(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, TimeoutError):
        return "no data from the server"
    return str(exc) or type(exc).__name__


def create_app(
    url: str = DEFAULT_URL,
    api_key: str | None = None,
    *,
    clock: Callable[[], float] = time.time,
    retry_s: float = 1.0,
    read_timeout_s: float = 5.0,
    verify_tls: bool = True,
    log_path: str | None = None,
) -> DashboardApp:
    """The dashboard for the appliance at `url` (the one factory of the CLI and the tests)."""
    source = StatsSource(url, api_key, read_timeout_s=read_timeout_s, verify_tls=verify_tls)
    return DashboardApp(source, clock=clock, retry_s=retry_s, log_path=log_path)
