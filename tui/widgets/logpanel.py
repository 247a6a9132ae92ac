"""LogPanel: the server's log lines when the dashboard and the server share one process
(`appliance serve --tui`); the same lines also go to the log file named in its title."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import RichLog

from tui.model import View
from tui.widgets.base import Panel

MAX_LINES = 2000


class LogPanel(Panel):
    TITLE = "Log"

    def __init__(self, log_path: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.log_path = log_path
        if log_path:
            self.border_title = f"{self.TITLE} · {log_path}"
        self._pending: list[str] | None = []
        """Lines written before the panel was mounted; None once it is."""

    def compose(self) -> ComposeResult:
        yield RichLog(max_lines=MAX_LINES, wrap=False, markup=False, id="log-lines")

    def on_mount(self) -> None:
        lines = self.query_one(RichLog)
        for line in self._pending:
            lines.write(line)
        self._pending = None

    def write_line(self, line: str) -> None:
        """Show a line (kept until the panel is on screen, for lines from the startup)."""
        if self._pending is not None:
            self._pending.append(line)
        else:
            for lines in self.query(RichLog):  # none once the app has closed
                lines.write(line)

    def show(self, view: View) -> None:
        pass
