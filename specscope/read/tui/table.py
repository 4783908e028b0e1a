"""Tables drawn line by line (Textual's line API): only the rows on screen are rendered, so a frame costs the
same with 10 or 1,000 rows, and nothing is re-measured when a value changes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, Generic, TypeVar

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from specscope.core.model import RequestRecord
from specscope.read.tui.view import row_text

_CURSOR = Style(reverse=True)
Row = TypeVar("Row")


class LineTable(ScrollView, Generic[Row], can_focus=True):
    """Rows of any kind, each shown as one line by ``format``, with a cursor; Enter posts :class:`Selected`."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "move(-10)", "Page up", show=False),
        Binding("pagedown", "move(10)", "Page down", show=False),
        Binding("home", "move(-1000000)", "First", show=False),
        Binding("end", "move(1000000)", "Last", show=False),
        Binding("enter", "select", "Select", show=False),
    ]

    class Selected(Message):
        """Enter was pressed on row ``index``."""

        def __init__(self, table: LineTable[object], index: int) -> None:
            super().__init__()
            self.table, self.index = table, index

    def __init__(self, format: Callable[[Row], str], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.format = format
        self.records: Sequence[Row] = []
        self.cursor = 0

    def set_records(self, records: Sequence[Row]) -> None:
        """Show ``records`` in this order; the cursor keeps its row number."""
        self.records = records
        self.cursor = min(self.cursor, max(0, len(records) - 1))
        size = Size(self.size.width, len(records))
        if size != self.virtual_size:
            self.virtual_size = size
        self.refresh()

    @property
    def row_count(self) -> int:
        """Rows shown."""
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

    def action_select(self) -> None:
        """Tell the app which row was chosen."""
        if self.records:
            self.post_message(self.Selected(self, self.cursor))  # type: ignore[arg-type]

    def render_line(self, y: int) -> Strip:
        """One screen line: the row at the scroll position plus ``y``."""
        i = int(self.scroll_offset.y) + y
        width = self.scrollable_content_region.width
        if i >= len(self.records):
            return Strip.blank(width)
        text = self.format(self.records[i]).ljust(width)[:width]
        style = _CURSOR if i == self.cursor and self.has_focus else Style()
        return Strip([Segment(text, style)], width)


class RequestTable(LineTable[RequestRecord]):
    """The recent requests, one per line."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(row_text, id=id)
