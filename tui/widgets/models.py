"""ModelsPanel: with several models, one line per model (status, planned memory, requests
running and served, when last asked for), the one the other panels show marked with `>`;
Enter or a click on a row shows that model. Hidden for a server with one model."""

from __future__ import annotations

from textual import events, on
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable

from tui import models
from tui.model import View
from tui.widgets.base import Panel


class ModelsTable(DataTable):
    """A click on another row selects it at once (a DataTable's first click only moves the
    cursor there)."""

    async def _on_click(self, event: events.Click) -> None:
        before = self.cursor_row
        await super()._on_click(event)
        if self.cursor_row != before and self.row_count:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
            self.post_message(DataTable.RowSelected(self, self.cursor_row, key))


class ModelsPanel(Panel):
    TITLE = "Models"
    _shown: str | None = None
    """The model the cursor was last moved to."""

    class Chosen(Message):
        """The user picked the model whose figures the panels should show."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def compose(self) -> ComposeResult:
        yield ModelsTable(cursor_type="row", id="models-table")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for name in models.COLUMNS:
            table.add_column(name, key=name)
        self.display = False

    def show(self, view: View) -> None:
        rows = models.model_rows(view.doc)
        self.display = rows is not None
        if rows is None:
            return
        shown = str(view.doc.get("model") or "")
        now = view.doc.get("time") or 0.0
        self.border_title = f"{self.TITLE} · showing {shown}  (m: next)"
        table = self.query_one(DataTable)
        names = [r.name for r in rows]
        if names == [rk.value for rk in table.rows]:
            for row in rows:
                cells = row.cells(now, row.name == shown)
                for column, cell in zip(models.COLUMNS, cells, strict=True):
                    table.update_cell(row.name, column, cell)
        else:
            table.clear()
            for row in rows:
                table.add_row(*row.cells(now, row.name == shown), key=row.name)
            self._shown = None
        if shown != self._shown and shown in names:  # the cursor follows a new choice only
            table.move_cursor(row=names.index(shown))
            self._shown = shown

    @on(DataTable.RowSelected, "#models-table")
    def _chosen(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.post_message(self.Chosen(str(event.row_key.value)))
