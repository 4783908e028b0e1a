"""Pilot tests: every key, sorting, filtering, pause, resize to 80×24, source loss and recovery, fleet drill-down."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from specscope.core import codec
from specscope.read.fleet import Target
from specscope.read.scrape import EndpointSource
from specscope.read.tui.app import HelpScreen, TopApp
from specscope.read.tui.table import RequestTable
from tests.read.tui.conftest import replay_app
from tests.read.tui.helpers import Clock, busy_hub, http_server, reply

pytestmark = pytest.mark.anyio

WEAK = "weak draft (f=0.1)"


def rates(app: TopApp) -> list[float | None]:
    return [r.acceptance_rate for r in app.query_one("#requests", RequestTable).records]


async def test_sort_worst_reverse_and_filter() -> None:
    app = replay_app(130, only=WEAK)
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one("#requests", RequestTable)
        assert table.row_count > 20
        seqs = [r.seq for r in table.records]
        assert seqs == sorted(seqs, reverse=True)  # newest first
        await pilot.press("a")
        worst = rates(app)
        assert worst == sorted(worst) and worst[0] == min(r.acceptance_rate for r in table.records)  # type: ignore[type-var]
        await pilot.press("S")
        assert rates(app) == sorted(worst, reverse=True)
        await pilot.press("s")
        assert app.sort == 2  # acceptance length
        lengths = [r.mean_acceptance_length for r in table.records]
        assert lengths == sorted(lengths, reverse=True)  # type: ignore[type-var]
        for _ in range(len(app.targets) and 7):
            await pilot.press("s")
        assert app.sort == 1
        await pilot.press("slash", *"acc<0.15", "enter")
        assert app.filter_text == "acc<0.15"
        kept = rates(app)
        assert kept and all(r is not None and r < 0.15 for r in kept)
        assert app.focused is table
        await pilot.press("escape")
        assert app.filter_text == ""
        one = table.records[-1].request_id
        await pilot.press("slash", *one, "enter")  # text matches request ids
        assert one in [r.request_id for r in table.records] and all(one in r.request_id for r in table.records)
        await pilot.press("escape")
        assert app.filter_text == "" and table.row_count > 20
        await pilot.press("down", "down")
        assert table.cursor == 2


async def test_pause_window_reset_help_and_quit() -> None:
    app = replay_app(125, only=WEAK)
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.player is not None and app.player.paused
        await pilot.press("p")
        assert not app.player.paused
        await pilot.press("p")
        assert app.player.paused
        before = app.player.position
        await pilot.press("n")
        assert app.player.position > before  # one recorded snapshot on
        await pilot.press("plus", "plus")
        assert app.player.speed == 4.0
        await pilot.press("minus")
        assert app.player.speed == 2.0
        assert app.window_s == 10.0
        await pilot.press("w")
        assert app.window_s == 60.0
        await pilot.press("w", "w")
        assert app.window_s == 10.0
        assert app.current.windowed(10).window.generation_tokens > 0  # type: ignore[union-attr]
        await pilot.press("r")
        assert app.current.windowed(10).window.generation_tokens == 0  # type: ignore[union-attr]
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("tab")
        assert app.focused is not None
        await pilot.press("q")
    assert not app.is_running


async def test_live_pause_stops_polling() -> None:
    hub = busy_hub(Clock())

    class Src:
        name = "hub"
        calls = 0

        def fetch(self) -> Any:
            Src.calls += 1
            return hub.snapshot()

    async def polls_reach(n: int) -> bool:  # a loaded 2-core machine may poll later than every 50 ms
        for _ in range(60):
            if Src.calls >= n:
                return True
            await pilot.pause(0.05)
        return False

    app = TopApp([Target(Src())], interval=0.05)
    async with app.run_test() as pilot:
        assert await polls_reach(2)
        await pilot.press("p")
        assert app.paused and "PAUSED" in str(app.query_one("#header").render())
        await pilot.pause(0.1)
        frozen = Src.calls
        await pilot.pause(0.3)
        assert Src.calls <= frozen + 1  # at most one poll already under way
        await pilot.press("p")
        assert await polls_reach(frozen + 2)


async def test_resize_to_80x24_keeps_every_panel() -> None:
    app = replay_app(130)
    async with app.run_test(size=(140, 50)) as pilot:
        app.select(WEAK)
        assert not app.screen.has_class("compact")
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.screen.has_class("compact")
        for panel in ("#header", "#fleet", "#spec", "#kv", "#gpu", "#alerts", "#requests"):
            region = app.query_one(panel).region
            assert region.height >= 1 and region.right <= 80 and region.bottom <= 24, panel
        assert "WEAK" in str(app.query_one("#spec").render())


async def test_fleet_drill_down() -> None:
    app = replay_app(130)
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.current.name == "tokenizer check"
        fleet = app.query_one("#fleet")
        fleet.focus()
        await pilot.press("down", "down", "down", "enter")
        assert app.current.name == WEAK
        assert app.query_one("#requests", RequestTable).row_count > 0


async def test_source_loss_and_recovery() -> None:
    hub = busy_hub(Clock())
    state = {"up": True}

    def handle(req: Any) -> None:
        if state["up"]:
            reply(req, 200, json.dumps(codec.to_dict(hub.snapshot())).encode())
        else:
            reply(req, 200, b"garbage")

    with http_server(handle) as url:
        app = TopApp([Target(EndpointSource(url, timeout=0.5))], interval=0)
        async with app.run_test(size=(100, 30)) as pilot:
            app.poll_now()
            app.refresh_view()
            assert "source ok" in str(app.query_one("#header").render())
            state["up"] = False
            app.poll_now()
            app.refresh_view()
            await pilot.pause()
            header = str(app.query_one("#header").render())
            assert "SOURCE DOWN" in header and "not a specscope snapshot" in header
            assert app.query_one("#requests", RequestTable).row_count == 30  # the last good numbers stay
            state["up"] = True
            app.poll_now()
            app.refresh_view()
            assert "source ok" in str(app.query_one("#header").render())


@contextlib.asynccontextmanager
async def top_of(hub: Any) -> AsyncIterator[tuple[TopApp, Any]]:
    """``specscope top --url`` on a server whose snapshot endpoint serves ``hub``'s, polled once, at 120x40."""
    def handle(req: Any) -> None:
        reply(req, 200, json.dumps(codec.to_dict(hub.snapshot())).encode())

    with http_server(handle) as url:
        app = TopApp([Target(EndpointSource(url, timeout=0.5))], interval=0)
        async with app.run_test(size=(120, 40)) as pilot:
            app.poll_now()
            app.refresh_view()
            await pilot.pause()
            yield app, pilot


async def test_capture_shows_its_classes_and_counts_never_its_text(tmp_path: Path) -> None:
    """Capture on (``SPECSCOPE_CAPTURE_*``): the header says for which classes, which are weak now, and how many
    rows and bytes it kept; read from a server's snapshot, which carries the counts and nothing captured."""
    from specscope.engine.capture import Capture, CaptureConfig, Payload

    hub = busy_hub(Clock())
    cap = Capture(CaptureConfig(tmp_path, ("weak", "code")), hub)
    cap.hold("captured", Payload("secret prompt", [1, 2], [3, 4], "secret completion", None, None))
    hub.requests.record("captured", traffic_class="code", prompt_tokens=2, generation_tokens=2)
    assert hub.requests.wait_idle(5)
    cap.close()

    async with top_of(hub) as (app, _):
        header = str(app.query_one("#header").render())
        line = next(x for x in header.splitlines() if x.startswith("capture"))
        size = (tmp_path / next(p.name for p in tmp_path.iterdir())).stat().st_size
        assert line == f"capture on: classes weak, code (none now); 1 row, {size / 1e6:.1f} MB kept"
        assert "secret" not in header


async def test_an_api_server_that_cannot_share_shows_1_of_n(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its numbers are its own part of the server: the header says so, compact (two lines) or not."""
    from specscope.engine import share

    for name in ("SPECSCOPE_SHARE_DIR", share.SERVER_ENV):
        monkeypatch.delenv(name, raising=False)
    hub = busy_hub(Clock())
    share.join(hub, 1, 4)  # no directory named: it shares nothing

    async with top_of(hub) as (app, pilot):
        header = app.query_one("#header").render()
        assert ("1 of 4 API-server processes: these numbers are its, not the server's totals"
                in str(header).splitlines())
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        app.refresh_view()
        lines = str(app.query_one("#header").render()).splitlines()
        assert lines[1].startswith("1 of 4 API-server processes  vllm")


def class_hub() -> Any:
    """A hub whose finished requests came in two classes: chat accepts 3 of 4 drafts a step, code 1 of 4."""
    clock = Clock()
    hub = busy_hub(clock, requests=4)
    for i in range(12):
        good = i % 3 != 0  # 8 chat requests, 4 code
        acc = 3 if good else 1
        hub.requests.record(f"cls-{i}", traffic_class="chat" if good else "code", prompt_tokens=30,
                           generation_tokens=40, e2e_s=0.5, spec_steps=10, draft_tokens=40, accepted_tokens=10 * acc,
                           acceptance_histogram=tuple(10 if j == acc else 0 for j in range(5)))
    return hub


def class_rows(app: TopApp) -> list[str]:
    lines = str(app.query_one("#classes").render()).splitlines()
    return [line.split()[0] for line in lines[2:] if line.strip() and not line.startswith("...")]


class ClassSource:
    name = "classes"
    live = True  # top shows a live source's fetch time

    def __init__(self, hub: Any) -> None:
        self.hub = hub

    def fetch(self) -> Any:
        return self.hub.snapshot()


async def test_the_class_table_shows_the_worst_class_first_and_sorts() -> None:
    app = TopApp([Target(ClassSource(class_hub()))], interval=0.05)
    async with app.run_test(size=(140, 45)) as pilot:
        for _ in range(40):
            if app.query_one("#classes").display and class_rows(app):
                break
            await pilot.pause(0.05)
        text = str(app.query_one("#classes").render())
        assert "TRAFFIC CLASSES (worst acceptance first" in text
        assert class_rows(app) == ["code", "prompt:<256", "chat"]  # 25%, 56% (busy_hub's requests), 75%
        assert "code" in text and "WEAK" in text.split("code", 1)[1].splitlines()[0]
        await pilot.press("c")
        assert class_rows(app) == ["chat", "code", "prompt:<256"]  # most requests first (8, 4, 4)
        await pilot.press("c")
        assert class_rows(app) == ["chat", "code", "prompt:<256"]  # by name
        await pilot.press("c")
        assert class_rows(app)[0] == "code"


async def test_the_class_table_keeps_the_worst_classes_at_80x24_and_says_how_many_it_leaves_out() -> None:
    app = TopApp([Target(ClassSource(class_hub()))], interval=0)
    app.poll_now()
    async with app.run_test(size=(80, 24)):
        assert app.query_one("#classes").region.height == 5  # its border, title, header and two rows: all seen
        assert class_rows(app) == ["code", "prompt:<256"]
        assert "(worst acceptance first, 2 of 3 shown; c to sort)" in str(app.query_one("#classes").render())


def test_the_class_table_prices_each_class_and_counts_the_folded_names() -> None:
    from dataclasses import replace

    from specscope.core.model import CostRatio
    from specscope.read.tui.view import classes_panel

    hub = class_hub()
    hub.set_cost_ratio(CostRatio(0.13, "estimated from parameters per token", 40_000_000, 5_000_000))
    title, header, *rows = classes_panel(replace(hub.snapshot(), folded_classes=3), 0.3).plain.splitlines()
    assert title == "TRAFFIC CLASSES (worst acceptance first, +3 classes folded into other; c to sort)"
    assert header.split()[:6] == ["class", "kind", "req", "share", "accept", "len"]
    speedups = [float(r.split()[-2 if r.endswith("WEAK") else -1].rstrip("x")) for r in rows]
    assert len(speedups) == 3 and speedups == sorted(speedups) and speedups[0] > 1  # more accepted, more speedup


async def test_no_class_table_without_classes() -> None:
    app = replay_app(130, only="tokenizer check")  # no requests: no classes
    async with app.run_test(size=(120, 40)):
        assert not app.query_one("#classes").display


def test_a_target_whose_engine_has_not_reported_reads_na_not_no_spec() -> None:
    from specscope.core.model import EngineInfo
    from specscope.read.tui.view import fleet_row
    from specscope.state.hub import Hub

    hub = Hub()

    class Src:
        name = "hub"

        def fetch(self) -> Any:
            return hub.snapshot()

    target = Target(Src())
    target.poll()
    assert fleet_row(target, 0).split()[2:4] == ["n/a", "n/a"]  # no engine yet: unknown, not "no speculation"
    hub.set_engine(EngineInfo(model="m"))
    target.poll()
    assert fleet_row(target, 0).split()[2:5] == ["m", "no", "spec"]


@pytest.mark.parametrize(("size", "rows"), [((100, 34), 5), ((120, 40), 11)])
async def test_the_requests_keep_rows_beside_a_fleet(size: tuple[int, int], rows: int) -> None:
    """The demo's five targets with the weak draft shown (two alerts, a class table): under 44 rows the panels and
    alerts are held shorter and the class table gives way, so the request table keeps rows (at 100×34 it had
    none)."""
    from tests.read.tui.conftest import replay_app

    app = replay_app(130)
    async with app.run_test(size=size) as pilot:
        app.select("weak draft (f=0.1)")
        app.refresh_view()
        await pilot.pause()
        assert app.query_one("#fleet-box").display and not app.query_one("#classes").display
        assert "SpecscopeWeakDraft" in str(app.query_one("#alerts").render())
        assert app.query_one("#requests", RequestTable).size.height >= rows
