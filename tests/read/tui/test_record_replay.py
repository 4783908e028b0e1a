"""Recordings are compact and bounded; replay rebuilds the same snapshots and keeps memory flat."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from specscope.core import codec
from specscope.read.fleet import Target
from specscope.read.scrape import SourceError
from specscope.read.tui.app import TopApp
from specscope.read.tui.record import Player, Recorder, ReplaySource
from tests.read.tui.helpers import Clock, busy_hub, feed


def record(path: Path, polls: int, max_bytes: int = 100 << 20) -> tuple[Recorder, list]:
    clock = Clock()
    hub = busy_hub(clock, requests=5)
    rec = Recorder(path, max_bytes)
    snaps = []
    for i in range(polls):
        feed(hub, clock, 3, accepted_of_4=2, start=5 + 3 * i)
        snap = hub.snapshot()
        rec.write("engine-a", snap)
        snaps.append(snap)
    rec.close()
    return rec, snaps


def test_replay_rebuilds_what_was_recorded(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _, snaps = record(path, polls=6)
    lines = path.read_text().splitlines()
    assert len(lines) == 6
    # Compact: each request is written once, when it is final (both parts in, or the second can no longer come).
    written = [r["request_id"] for line in lines for r in json.loads(line)["snapshot"]["requests"]]
    assert len(written) == len(set(written)) and written == sorted(written)
    player = Player(path)
    assert player.targets == ["engine-a"]
    src = ReplaySource(player, "engine-a")
    player.step()
    first = src.fetch()
    assert first.lifetime == snaps[0].lifetime and first.time == snaps[0].time
    player.advance(1e6)
    last = src.fetch()
    assert last.lifetime == snaps[-1].lifetime and player.finished
    final = {r.request_id for r in snaps[-1].requests if r.final_seq}
    assert {r.request_id for r in last.requests} == final


def test_pause_speed_and_step(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _, snaps = record(path, polls=5)  # 3 s between polls
    player = Player(path)
    src = ReplaySource(player, "engine-a")
    player.advance(0)
    assert src.fetch().time == snaps[0].time
    player.paused = True
    player.advance(100)
    assert src.fetch().time == snaps[0].time  # paused: nothing moves
    player.step()
    assert src.fetch().time == snaps[1].time  # but a step does
    player.paused, player.speed = False, 2.0
    player.advance(1.5)  # 3 s of recording at 2x
    assert src.fetch().time == snaps[2].time


def test_recording_stops_at_its_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rec, _ = record(path, polls=20, max_bytes=20_000)
    assert rec.full and path.stat().st_size <= 20_000
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_bad_recordings_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read recording"):
        Player(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n{}\n")
    with pytest.raises(ValueError, match="holds no specscope snapshots"):
        Player(bad)


def played(player: Player, src: ReplaySource, limit: int = 100) -> list[float]:
    """Step through the recording (at most ``limit`` steps): each snapshot time shown."""
    shown: list[float] = []
    for _ in range(limit):
        if player.finished:
            break
        player.step()
        with contextlib.suppress(SourceError):
            if not shown or src.fetch().time != shown[-1]:
                shown.append(src.fetch().time)
    return shown


def test_unusable_lines_are_skipped_counted_and_said_and_replay_goes_on(tmp_path: Path) -> None:
    """Issue 48: a line whose "t" was NaN stopped replay for good, silently. Every line replay cannot use is
    skipped and counted, the count is on the status line, and every good line plays."""
    path = tmp_path / "r.jsonl"
    _, snaps = record(path, polls=6)
    good = path.read_text().splitlines()
    doc = json.loads(good[2])
    bad = [json.dumps({**doc, "t": float("nan")}), json.dumps({**doc, "t": float("inf")}),
           json.dumps({**doc, "t": "12"}), json.dumps({**doc, "t": None}), json.dumps({k: v for k, v in doc.items()
                                                                                       if k != "t"}),
           json.dumps({**doc, "snapshot": {"wire_version": 99}}), good[3][: len(good[3]) // 2]]
    path.write_text("\n".join(good[:3] + bad + good[3:]) + "\n")
    player = Player(path)
    src = ReplaySource(player, "engine-a")
    assert played(player, src) == [s.time for s in snaps] and player.finished
    assert player.skipped == len(bad)
    app = TopApp([Target(src)], interval=0, player=player)
    assert "7 unusable lines skipped" in app._status()
    nan_first = tmp_path / "nan-first.jsonl"  # a recording that starts with one
    nan_first.write_text("\n".join(bad[:1] + good) + "\n")
    again = Player(nan_first)
    assert again.start == snaps[0].time
    assert played(again, ReplaySource(again, "engine-a")) == [s.time for s in snaps] and again.skipped == 1


def test_a_clock_stepped_back_plays_on_at_the_recorded_pace(tmp_path: Path) -> None:
    """A target's time that goes back 40 s mid-recording: the lines after it play at their own 3 s pace from where
    replay was, neither all at once nor after a wait."""
    path = tmp_path / "r.jsonl"
    _, snaps = record(path, polls=6)  # 3 s apart
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for d in lines[3:]:
        d["t"] -= 40
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    player = Player(path)
    src = ReplaySource(player, "engine-a")
    shown = []
    for _ in range(6):
        player.advance(0 if not shown else 3)
        shown.append(src.fetch().time)
    assert shown == [s.time for s in snaps]  # one recorded snapshot each 3 s
    assert player.skipped == 0


def test_once_plays_past_an_unusable_line_and_says_how_many(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``top --replay FILE --once`` played until the end, which a NaN time never let it reach."""
    from specscope.cli import main

    path = tmp_path / "r.jsonl"
    _, snaps = record(path, polls=4)
    lines = path.read_text().splitlines()
    nan = json.dumps({**json.loads(lines[1]), "t": float("nan")})
    path.write_text("\n".join([*lines[:2], nan, *lines[2:]]) + "\n")
    assert main(["top", "--replay", str(path), "--once", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["lifetime"] == json.loads(json.dumps(codec.to_dict(snaps[-1])))["lifetime"]
    assert "1 unusable line skipped" in err
