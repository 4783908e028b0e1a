"""SVG snapshots of each screen, fed from the fixed recording (pytest-textual-snapshot; --snapshot-update)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.read.tui.conftest import replay_app


def test_weak_draft_with_alerts(snap_compare: Any) -> None:
    assert snap_compare(replay_app(130, only="weak draft (f=0.1)"), terminal_size=(120, 40))


def test_fleet(snap_compare: Any) -> None:
    assert snap_compare(replay_app(80), terminal_size=(110, 40))


def test_fleet_at_80x24(snap_compare: Any) -> None:
    assert snap_compare(replay_app(80), terminal_size=(80, 24))


def test_worst_requests_first(snap_compare: Any) -> None:
    assert snap_compare(replay_app(130, only="weak draft (f=0.1)"), press=["a"], terminal_size=(100, 34))


def test_help(snap_compare: Any) -> None:
    assert snap_compare(replay_app(10), press=["question_mark"], terminal_size=(90, 30))


def test_no_color(snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(replay_app(130, only="weak draft (f=0.1)"), terminal_size=(100, 34))


def test_traffic_classes(snap_compare: Any) -> None:
    from specscope.read.fleet import Target
    from specscope.read.tui.app import TopApp
    from tests.read.tui.test_app import ClassSource, class_hub

    source = ClassSource(class_hub())
    source.live = False  # no fetch time in the header: it depends on the machine's load
    app = TopApp([Target(source)], interval=0)
    app.poll_now()
    assert snap_compare(app, terminal_size=(140, 45))
