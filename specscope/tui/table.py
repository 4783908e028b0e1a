"""The requests table: only the rows on screen are drawn, so a frame costs the same with 10 or 1,000 rows."""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from specscope.model import RequestRecord
from specscope.tui.view import row_text

_CURSOR = Style(reverse=True)


class RequestTable(ScrollView, can_focus=True):
    """Rows of :func:`~specscope.tui.view.row_text`, with a cursor; rendered line by line (Textual's line API)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "move(-10)", "Page up", show=False),
        Binding("pagedown", "move(10)", "Page down", show=False),
        Binding("home", "move(-1000000)", "First", show=False),
        Binding("end", "move(1000000)", "Last", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.records: list[RequestRecord] = []
        self.cursor = 0

    def set_records(self, records: list[RequestRecord]) -> None:
        """Show ``records`` in this order; the cursor keeps its row number."""
        self.records = records
        self.cursor = min(self.cursor, max(0, len(records) - 1))
        self.virtual_size = Size(self.size.width, len(records))
        self.refresh()

    @property
    def row_count(self) -> int:
        """Rows after filtering."""
        return len(self.records)

    def action_move(self, delta: int) -> None:
        """Move the cursor and keep it on screen."""
        if not self.records:
            return
        self.cursor = max(0, min(len(self.records) - 1, self.cursor + delta))
        top, height = int(self.scroll_offset.y), self.scrollable_content_region.height
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False)
        self.refresh()

    def render_line(self, y: int) -> Strip:
        """One screen line: the row at the scroll position plus ``y``."""
        i = int(self.scroll_offset.y) + y
        width = self.scrollable_content_region.width
        if i >= len(self.records):
            return Strip.blank(width)
        text = row_text(self.records[i]).ljust(width)[:width]
        style = _CURSOR if i == self.cursor and self.has_focus else Style()
        return Strip([Segment(text, style)], width)
