"""KeysPanel: who uses the GPU: one line per API key (class, requests, 429s, running, tokens,
summed queue time), filtered by key name or class (`/` while the panel has focus)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.reactive import reactive
from textual.widgets import DataTable, Input, Static

from tui import keys
from tui.model import View
from tui.widgets.base import Panel


class KeysPanel(Panel):
    TITLE = "Keys"

    key_filter: reactive[str] = reactive("")

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="filter by key name or class: interactive, batch…", id="keys-filter"
        )
        yield Static("no per-key figures from the server", id="keys-none")
        yield DataTable(cursor_type="row", id="keys-table")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for name in keys.COLUMNS:
            table.add_column(name, key=name)
        self._retitle()

    def show(self, view: View) -> None:
        self._fill()

    def watch_key_filter(self) -> None:
        self._retitle()
        self._fill()

    def open_filter(self) -> None:
        box = self.query_one("#keys-filter", Input)
        box.value = self.key_filter
        box.display = True
        box.focus()

    @on(Input.Changed, "#keys-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.key_filter = event.value

    @on(Input.Submitted, "#keys-filter")
    def _filter_done(self) -> None:
        self._close_filter()

    def key_escape(self) -> None:
        box = self.query_one("#keys-filter", Input)
        if box.display:
            box.value = ""
            self._close_filter()

    def _close_filter(self) -> None:
        self.query_one("#keys-filter", Input).display = False
        self.query_one(DataTable).focus()

    def _retitle(self) -> None:
        f = self.key_filter.strip()
        self.border_title = f"{self.TITLE} · filter {f!r}" if f else self.TITLE

    def _fill(self) -> None:
        if not self.is_mounted:
            return
        rows = keys.key_rows(self.view.doc) if self.view else None
        self.query_one("#keys-none", Static).display = rows is None
        table = self.query_one(DataTable)
        table.display = rows is not None
        shown = keys.select_keys(rows or [], self.key_filter)
        names = [r.name for r in shown]
        if names == [rk.value for rk in table.rows]:
            for row in shown:
                for column, cell in zip(keys.COLUMNS, row.cells()):
                    table.update_cell(row.name, column, cell)
            return
        table.clear()
        for row in shown:
            table.add_row(*row.cells(), key=row.name)
