"""Panel: the base of the dashboard's regions: a titled, focusable box that re-renders when
its bound `view` (the latest stats) changes."""

from __future__ import annotations

from textual.containers import Vertical
from textual.reactive import reactive

from tui.model import View


class Panel(Vertical, can_focus=True):
    """A region of the main screen. Subclasses implement `show(view)`; Tab moves focus between
    panels and the focused one is drawn with a double top rule (visible without colour)."""

    TITLE = ""
    view: reactive[View | None] = reactive(None, always_update=True)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = self.TITLE

    def watch_view(self, view: View | None) -> None:
        if view is not None and self.is_mounted:
            self.show(view)

    def show(self, view: View) -> None:
        """Render the latest stats view; every panel overrides this."""
