"""``specscope top``: the Textual dashboard.

Sources are polled on worker threads (a slow or dead target never blocks the screen or the others); each poll
updates the targets' state, then one frame redraws the panels from :mod:`specscope.read.tui.view`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Static

from specscope.export.alerts.evaluate import Alert
from specscope.export.alerts.rules import Thresholds
from specscope.read.fleet import Target
from specscope.read.scrape import NO_PLUGIN, NO_PLUGIN_SAYS
from specscope.read.tui import view
from specscope.read.tui.record import Player, Recorder
from specscope.read.tui.table import LineTable, RequestTable

#: Window lengths the ``w`` key cycles through, in seconds.
WINDOWS = (10.0, 60.0, 300.0)

HELP = """\
q quit            p pause / resume (replay: play / pause)
s next sort column    S reverse the sort    a worst acceptance first
c traffic classes: next sort (worst acceptance, most requests, name)
/ filter requests: text, acc<0.3 or acc>0.8 (Enter applies, Esc clears)
tab next panel    enter on a fleet row: show that engine
w window length (10 s, 60 s, 300 s)    r reset the window
replay: n step one snapshot, + faster, - slower
? this help (Esc closes)"""


class HelpScreen(ModalScreen[None]):
    """The keys."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")


class TopApp(App[None]):
    """The dashboard over one or more targets."""

    TITLE = "specscope top"
    AUTO_FOCUS = "#requests"
    CSS = """
    Screen { layout: vertical; overflow: hidden; }
    #header { height: auto; max-height: 4; }
    #fleet-box { height: auto; max-height: 10; }
    #fleet-header { height: 1; text-style: underline; }
    #fleet { height: auto; max-height: 9; }
    #panels { height: auto; max-height: 14; }
    #spec { width: 3fr; height: auto; margin: 0 1 0 0; }
    #side-col { width: 2fr; height: auto; }
    #kv, #gpu, #alerts, #classes { height: auto; }
    #classes { max-height: 9; border-top: solid $primary; }
    .compact #classes { max-height: 5; text-wrap: nowrap; text-overflow: ellipsis; }
    #alerts { max-height: 8; border-top: solid $primary; }
    .compact #alerts { max-height: 4; text-wrap: nowrap; text-overflow: ellipsis; }
    .compact #fleet-box { max-height: 5; }
    .compact #fleet { max-height: 4; }
    .compact #panels { max-height: 8; }
    .compact #header { max-height: 2; }
    .crowded #panels { max-height: 12; }
    .crowded #alerts { max-height: 5; text-wrap: nowrap; text-overflow: ellipsis; }
    #requests-title { height: 1; text-style: bold; }
    #requests-header { height: 1; text-style: underline; }
    #requests { height: 1fr; min-height: 3; }
    #filter { display: none; height: 3; }
    #filter.open { display: block; }
    #help { border: round $primary; width: auto; height: auto; padding: 1 2; background: $surface; }
    HelpScreen { align: center middle; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("p", "pause", "Pause"),
        Binding("s", "sort", "Sort"),
        Binding("S", "reverse", "Reverse", show=False),
        Binding("a", "worst", "Worst acc."),
        Binding("c", "class_sort", "Class sort"),
        Binding("slash", "filter", "Filter"),
        Binding("w", "window", "Window"),
        Binding("r", "reset", "Reset"),
        Binding("n", "step", "Step", show=False),
        Binding("plus", "speed(2.0)", "Faster", show=False),
        Binding("minus", "speed(0.5)", "Slower", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self, targets: list[Target], *, interval: float = 1.0, window_s: float = 60.0,
                 player: Player | None = None, recorder: Recorder | None = None,
                 thresholds: Thresholds | None = None, on_start: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.on_start = on_start
        self.targets = targets
        self.current = targets[0]
        self.engine: int | None = None  # one engine of the current target's data-parallel server, or all of them
        self.interval = interval
        self.window_s = window_s
        self.player = player
        self.recorder = recorder
        self.threshold = (thresholds or Thresholds()).weak_draft_acceptance
        self.paused = False
        self.sort = 0
        self.class_sort = 0
        self.reverse = False
        self.filter_text = ""
        self.alerts: dict[str, list[Alert]] = {t.name: [] for t in targets}
        self.note = ""
        self._pool = ThreadPoolExecutor(max_workers=min(8, len(targets)), thread_name_prefix="specscope-top")
        self._rows_key: Any = None
        self._shown: dict[str, Any] = {}
        self._fleet_rows: list[str] = []
        self._fleet_entries: list[tuple[Target, int | None]] = []

    # ----------------------------------------------------------------- layout
    def compose(self) -> ComposeResult:
        yield Static(id="header")
        with Vertical(id="fleet-box") as box:
            box.display = len(self.targets) > 1  # and when a target has several engines (see _draw_fleet)
            yield Static(view.fleet_header(), id="fleet-header")
            yield LineTable[str](str, id="fleet")
        with Horizontal(id="panels"):
            yield Static(id="spec")
            with Vertical(id="side-col"):
                yield Static(id="kv")
                yield Static(id="gpu")
        yield Static(id="alerts")
        yield Static(id="classes")
        yield Input(placeholder="filter: text, acc<0.3, acc>0.8", id="filter", disabled=True)
        yield Static(id="requests-title")
        yield Static(id="requests-header")
        yield RequestTable(id="requests")
        yield Footer()

    def on_mount(self) -> None:
        if self.interval > 0:
            self.set_interval(self.interval, self._tick)
            self._tick()
        else:
            self.refresh_view()
        if self.on_start is not None:
            self.on_start()

    # ----------------------------------------------------------------- polling
    def _tick(self) -> None:
        if self.player is not None:
            self.player.advance(self.interval)
        elif self.paused:
            return
        self.run_worker(self._poll_all, thread=True, exclusive=True, group="poll")

    def _poll_all(self) -> None:
        self.poll_now()
        if self.is_running:
            self.call_from_thread(self.refresh_view)

    def poll_now(self) -> None:
        """Poll every target once (concurrently), evaluate alerts and record; safe on any thread."""
        list(self._pool.map(Target.poll, self.targets))
        for t in self.targets:
            self.alerts[t.name] = t.evaluate()
            if self.recorder is not None and t.snapshot is not None and not t.error:
                self.recorder.write(t.name, t.snapshot)

    # ----------------------------------------------------------------- drawing
    def set_note(self, note: str) -> None:
        """A line for the header (the demo's current scenario)."""
        self.note = note
        self.refresh_view()

    def select(self, name: str, engine: int | None = None) -> None:
        """Show the target called ``name`` (one of its data-parallel engines, with ``engine``)."""
        self.current = next((t for t in self.targets if t.name == name), self.current)
        self.engine = engine
        self._rows_key = None
        self.refresh_view()

    def _status(self) -> str:
        parts = [self.note] if self.note else []
        if self.player is not None:
            p = self.player
            state = "paused" if p.paused else ("ended" if p.finished else "playing")
            parts.append(f"replay {state} {p.speed:g}x at +{p.position - p.start:.0f}s")
            if p.skipped:
                parts.append(f"{p.skipped} unusable line{'s' if p.skipped > 1 else ''} skipped")
        elif self.paused:
            parts.append("PAUSED")
        if self.recorder is not None:
            parts.append("recording FULL (stopped)" if self.recorder.full else f"recording {self.recorder.path.name}")
        if self.filter_text:
            parts.append(f"filter {self.filter_text!r}")
        return "  ".join(parts)

    def refresh_view(self) -> None:
        """Redraw every panel from the targets' state (nothing while another screen, e.g. help, is on top)."""
        if isinstance(self.screen, HelpScreen):
            return
        with contextlib.suppress(NoMatches):  # the app is closing: its widgets are gone
            self._draw()

    def _draw(self) -> None:
        cur = self.current
        snap = cur.windowed(self.window_s)
        engine = self.engine if snap is not None and any(e.index == self.engine for e in snap.engines) else None
        if engine is not None and snap is not None:
            snap = snap.for_engine(engine)
        compact = self.size.height < 32 or self.size.width < 100
        self.screen.set_class(compact, "compact")
        status = self._status() + (f"  engine {engine}" if engine is not None else "")
        self._update("#header", view.header(self.targets, cur, self.window_s, status, compact))
        self._update("#spec", view.spec_panel(snap, self.threshold, cur.series("acceptance"), compact=compact))
        self._update("#kv", view.kv_panel(snap, None if compact else cur.series("kv_usage")))
        self._update("#gpu", view.gpu_panel(snap))
        alerts = self.alerts.get(cur.name, [])
        if engine is not None:
            alerts = [a for a in alerts if dict(a.labels).get("engine", str(engine)) == str(engine)]
        self._update("#alerts", view.alerts_panel(alerts, compact))
        self._draw_fleet()
        # Under 44 rows beside a fleet table, the class table would push the requests off the screen (a weak class
        # still shows as its alert), and the panels and alerts are held shorter.
        crowded = self.size.height < 44 and self.query_one("#fleet-box").display
        self.screen.set_class(crowded and not compact, "crowded")
        classes = Text() if crowded else view.classes_panel(snap, self.threshold, self.class_sort, compact,
                                                            rows=2 if compact else 6)
        self.query_one("#classes").display = bool(classes.plain)
        self._update("#classes", classes)
        self._draw_requests(snap)

    def _update(self, selector: str, text: Any) -> None:
        """Give a panel new text only when it changed, and skip the layout pass when its shape cannot have:
        same number of lines, none wider than the panel (a layout of the whole screen is most of a frame)."""
        old = self._shown.get(selector)
        if old == text:
            return
        self._shown[selector] = text
        panel = self.query_one(selector, Static)
        lines = text.plain.split("\n")
        same_shape = (old is not None and old.plain.count("\n") == len(lines) - 1
                      and max(map(len, lines)) <= panel.content_region.width)
        panel.update(text, layout=not same_shape)

    def _draw_fleet(self) -> None:
        """One row per target; under a data-parallel server, one row per engine."""
        entries: list[tuple[Target, int | None]] = []
        rows = []
        for t in self.targets:
            alerts = self.alerts.get(t.name, [])
            entries.append((t, None))
            rows.append(view.fleet_row(t, len(alerts)))
            engines = t.snapshot.engines if t.snapshot is not None else ()
            if len(engines) > 1:
                for e in engines:
                    entries.append((t, e.index))
                    mine = sum(1 for a in alerts if dict(a.labels).get("engine") == str(e.index))
                    rows.append(view.fleet_row(t, mine, e.index))
        self._fleet_entries = entries
        self.query_one("#fleet-box").display = len(entries) > 1
        if rows != self._fleet_rows:
            self._fleet_rows = rows
            self.query_one("#fleet", LineTable).set_records(rows)

    def _draw_requests(self, snap: Any) -> None:
        table = self.query_one("#requests", RequestTable)
        if snap is None:
            self._update("#requests-title", Text("REQUESTS"))
            return
        if NO_PLUGIN in snap.unavailable:
            self._update("#requests-title", Text(f"REQUESTS: n/a ({NO_PLUGIN_SAYS})"))
        elif "requests" in snap.unavailable:
            self._update("#requests-title",
                         Text("REQUESTS: per-request rows are n/a from a /metrics page (use a specscope endpoint)"))
        else:
            label = view.COLUMNS[self.sort][0]
            self._update("#requests-title", Text(
                f"REQUESTS ({len(snap.requests)} recent) by {label}{' reversed' if self.reverse else ''}"
                "  keys: s sort  S reverse  a worst  / filter"))
        last = snap.requests[-1].seq if snap.requests else None
        key = (self.current.name, len(snap.requests), last, self.sort, self.reverse, self.filter_text)
        if key == self._rows_key:
            return  # nothing new: leave the table (and its cursor) alone
        self._rows_key = key
        self._update("#requests-header", Text(view.header_text(self.sort, self.reverse)))
        table.set_records(view.select_requests(snap.requests, self.sort, self.reverse, self.filter_text))

    # ----------------------------------------------------------------- actions
    def action_pause(self) -> None:
        """Stop or resume polling (replay: play or pause)."""
        if self.player is not None:
            self.player.paused = not self.player.paused
        else:
            self.paused = not self.paused
        self.refresh_view()

    def action_sort(self) -> None:
        """Sort the requests by the next column."""
        self.sort = (self.sort + 1) % len(view.COLUMNS)
        self.refresh_view()

    def action_reverse(self) -> None:
        """Reverse the sort."""
        self.reverse = not self.reverse
        self.refresh_view()

    def action_class_sort(self) -> None:
        """Sort the traffic classes by the next key (worst acceptance, most requests, name)."""
        self.class_sort = (self.class_sort + 1) % len(view.CLASS_SORTS)
        self.refresh_view()

    def action_worst(self) -> None:
        """Worst acceptance first."""
        self.sort, self.reverse = 1, False
        self.refresh_view()

    def action_filter(self) -> None:
        """Open the filter box."""
        box = self.query_one("#filter", Input)
        box.disabled = False
        box.add_class("open")
        box.value = self.filter_text
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Apply the filter and close the box."""
        self.filter_text = event.value.strip()
        event.input.remove_class("open")
        event.input.disabled = True
        self.query_one("#requests", RequestTable).focus()
        self.refresh_view()

    def action_clear_filter(self) -> None:
        """Clear the filter."""
        box = self.query_one("#filter", Input)
        box.remove_class("open")
        box.disabled = True
        self.filter_text = ""
        self.query_one("#requests", RequestTable).focus()
        self.refresh_view()

    def action_window(self) -> None:
        """Cycle the window length."""
        later = [w for w in WINDOWS if w > self.window_s]
        self.window_s = later[0] if later else WINDOWS[0]
        self.refresh_view()

    def action_reset(self) -> None:
        """Start the window afresh."""
        for t in self.targets:
            t.reset()
        self.refresh_view()

    def action_step(self) -> None:
        """Replay: show the next snapshot."""
        if self.player is not None:
            self.player.paused = True
            self.player.step()
            self.poll_now()
            self.refresh_view()

    def action_speed(self, factor: float) -> None:
        """Replay: change the speed."""
        if self.player is not None:
            self.player.speed = min(64.0, max(0.25, self.player.speed * factor))
            self.refresh_view()

    def action_help(self) -> None:
        """Show the keys."""
        self.push_screen(HelpScreen())

    def on_line_table_selected(self, event: LineTable.Selected) -> None:
        """Enter on a fleet row: show that target, or that engine of it, below."""
        if event.table.id == "fleet" and event.index < len(self._fleet_entries):
            target, engine = self._fleet_entries[event.index]
            self.select(target.name, engine)

    def on_resize(self) -> None:
        """Re-lay the panels for the new size (compact under 100×32; shorter beside a fleet under 44 rows), once the
        app has taken it."""
        self.call_after_refresh(self.refresh_view)

    def on_unmount(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

