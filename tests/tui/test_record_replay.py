"""Recordings are compact and bounded; replay rebuilds the same snapshots and keeps memory flat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specscope.tui.record import Player, Recorder, ReplaySource
from tests.tui.helpers import Clock, busy_hub, feed


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
