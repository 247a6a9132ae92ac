"""RequestsPanel: the table of running and recent requests, sortable (`s`, `S` reverses),
filtered by state, id or out mark (`/`), and Enter on a row asks for that request's trace."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import DataTable, Input

from tui import model
from tui.model import View
from tui.widgets.base import Panel

WIDE = 100
"""From this panel width on, ids are shown at up to 24 characters instead of 8, and the table
has its wide-only columns (model.WIDE_ONLY)."""


class RequestsPanel(Panel):
    TITLE = "Requests"

    state_filter: reactive[str] = reactive("")
    sort: reactive[str] = reactive("live")
    reverse: reactive[bool] = reactive(False)

    class TraceRequested(Message):
        def __init__(self, request_id: str) -> None:
            super().__init__()
            self.request_id = request_id

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="filter by state or out: running, finished, error, json…", id="filter"
        )
        yield DataTable(cursor_type="row", id="requests-table")

    def on_mount(self) -> None:
        self._retitle()

    # --- state ----------------------------------------------------------------------------
    def show(self, view: View) -> None:
        self._fill()

    def watch_state_filter(self) -> None:
        self._retitle()
        self._fill()

    def watch_sort(self) -> None:
        self._retitle()
        self._fill()

    def watch_reverse(self) -> None:
        self._retitle()
        self._fill()

    def on_resize(self) -> None:
        self._fill(force=True)

    def next_sort(self) -> None:
        names = list(model.SORTS)
        self.sort = names[(names.index(self.sort) + 1) % len(names)]

    def open_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = self.state_filter
        box.display = True
        box.focus()

    # --- events ---------------------------------------------------------------------------
    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.state_filter = event.value

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self._close_filter()

    def key_escape(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display:
            box.value = ""
            self._close_filter()

    def _close_filter(self) -> None:
        self.query_one("#filter", Input).display = False
        self.query_one(DataTable).focus()

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(self.TraceRequested(event.row_key.value))

    # --- drawing --------------------------------------------------------------------------
    def _retitle(self) -> None:
        arrow = "↑" if self.reverse else "↓"
        title = f"{self.TITLE} · sort {self.sort} {arrow}"
        if self.state_filter.strip():
            title += f" · filter {self.state_filter.strip()!r}"
        self.border_title = title

    def _fill(self, force: bool = False) -> None:
        if not self.is_mounted:
            return
        table = self.query_one(DataTable)
        rows = model.rows(self.view.doc) if self.view else []
        shown = model.select(rows, self.state_filter, self.sort, self.reverse)
        wide = self.size.width >= WIDE
        id_width = 24 if wide else 8
        columns = model.columns(wide)
        keys = [r.id for r in shown]
        current = [rk.value for rk in table.rows]
        same_columns = tuple(ck.value for ck in table.columns) == columns
        if keys == current and same_columns and not force:
            for row in shown:
                for column, cell in zip(columns, row.cells(id_width, columns)):
                    table.update_cell(row.id, column, cell)
            return
        selected = self._selected_id(table)
        scroll_y = table.scroll_y
        table.clear(columns=not same_columns)
        if not same_columns:
            for name in columns:
                table.add_column(name, key=name)
        for row in shown:
            table.add_row(*row.cells(id_width, columns), key=row.id)
        if selected in keys:
            table.move_cursor(row=keys.index(selected), scroll=False)
        table.scroll_to(y=scroll_y, animate=False, immediate=True)

    @staticmethod
    def _selected_id(table: DataTable) -> str | None:
        if not table.row_count:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # the cursor sits past the last row
            return None
