"""``--record FILE`` and ``--replay FILE``: snapshots as JSON lines, compact and bounded.

Each line is ``{"t": time, "target": name, "snapshot": {...}}``. To stay compact a line carries only the request
records that finished since the target's previous line (``"requests"`` holds the new ones, each written once it
is complete; replay rebuilds the table). A recording stops growing at ``max_bytes`` and says so. Replay reads
the file as it plays, so memory is flat however long the recording is. A line replay cannot use (torn, not JSON,
a time that is not a finite number, a snapshot that does not parse) is skipped and counted (:attr:`Player.skipped`,
shown with the replay's state). A target's time that goes back (its clock stepped) neither stalls nor rushes replay:
the line after the step plays its target's last gap after the line before, and the lines after it at their own pace.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections import deque
from pathlib import Path
from typing import IO, Any

from specscope.core import codec
from specscope.core.model import RequestRecord, Snapshot
from specscope.read.scrape import SourceError

#: Request rows a replayed target keeps, as the hub does by default.
MAX_REQUESTS = 1000


class Recorder:
    """Appends snapshots to a JSON-lines file until it reaches ``max_bytes``."""

    def __init__(self, path: str | Path, max_bytes: int = 100 << 20) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._file: IO[str] = _open(self.path, "w")
        self._written = 0
        self._last_seq: dict[str, int] = {}
        self.full = False

    def write(self, target: str, snap: Snapshot) -> None:
        """Add one snapshot of ``target``."""
        if self.full:
            return
        # A record still waiting for its second part is written once it is final (final_seq > 0).
        last = self._last_seq.get(target, 0)
        new = sorted((r for r in snap.requests if r.final_seq > last), key=lambda r: r.final_seq)
        if new:
            self._last_seq[target] = new[-1].final_seq
        d = codec.to_dict(dataclasses.replace(snap, requests=tuple(new)))
        line = json.dumps({"t": snap.time, "target": target, "snapshot": d}, separators=(",", ":")) + "\n"
        if self._written + len(line) > self.max_bytes:
            self.full = True
            self._file.flush()
            return
        self._file.write(line)
        self._written += len(line)
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class Player:
    """Plays a recording back against a clock that the dashboard advances (pause, step, speed)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file: IO[str] = _open(self.path, "r")
        except OSError as exc:
            raise ValueError(f"cannot read recording {path}: {exc.strerror or exc}") from None
        self.targets: list[str] = []
        start: float | None = None
        for line in self._file:  # one pass for the target names and the start time; nothing is kept
            rec = self._decode(line)
            if rec is None:
                continue
            if start is None:
                start = rec[0]
            if rec[1] not in self.targets:
                self.targets.append(rec[1])
        if start is None:
            raise ValueError(f"{path} holds no specscope snapshots")
        self._file.seek(0)
        self.start = start  # the recording's first timestamp
        self.position = start  # the recording's time now on screen
        self.speed = 1.0
        self.paused = False
        self.finished = False
        #: Lines played past that replay could not use (see the module docstring).
        self.skipped = 0
        self._latest: dict[str, Snapshot] = {}
        # Each target's last recorded time, what is added to its times (its clock's steps back) and its last gap.
        self._shift: dict[str, tuple[float, float, float]] = {}
        self._requests: dict[str, deque[RequestRecord]] = {t: deque(maxlen=MAX_REQUESTS) for t in self.targets}
        self._ahead: tuple[float, str, dict[str, Any]] | None = None

    @staticmethod
    def _decode(line: str) -> tuple[float, str, dict[str, Any]] | None:
        """A line's time, target and snapshot document; None where it is torn or foreign, or its time is not a
        finite number."""
        try:
            d = json.loads(line)
            t, target, snap = d["t"], str(d["target"]), d["snapshot"]
        except (ValueError, KeyError, TypeError):
            return None
        if type(t) not in (int, float) or not math.isfinite(t):
            return None
        return float(t), target, snap

    def advance(self, seconds: float) -> None:
        """Move the playback clock on by ``seconds`` × speed (nothing while paused)."""
        if not self.paused:
            self._play_until(self.position + seconds * self.speed)

    def step(self) -> None:
        """Show the next recorded snapshot, paused or not."""
        nxt = self._peek()
        if nxt is not None:
            self._play_until(nxt[0])

    def _peek(self) -> tuple[float, str, dict[str, Any]] | None:
        """The next usable line, its time on the playback clock: the recorded one, moved on by however far its
        target's clock stepped back (each step taken as the target's last gap between lines)."""
        while self._ahead is None:
            line = self._file.readline()
            if not line:
                self.finished = True
                return None
            rec = self._decode(line)
            if rec is None:
                self.skipped += 1
                continue
            t, target, d = rec
            last, shift, gap = self._shift.get(target, (t, 0.0, 0.0))
            if t < last:
                shift += last - t + gap
            else:
                gap = t - last
            self._shift[target] = (t, shift, gap)
            self._ahead = (t + shift, target, d)
        return self._ahead

    def _play_until(self, t: float) -> None:
        while (nxt := self._peek()) is not None and nxt[0] <= t:
            self._ahead = None
            _, target, d = nxt
            try:
                snap = codec.from_dict(d)
            except ValueError:
                self.skipped += 1
                continue
            kept = self._requests.setdefault(target, deque(maxlen=MAX_REQUESTS))
            kept.extend(snap.requests)
            self._latest[target] = dataclasses.replace(snap, requests=tuple(kept))
        self.position = max(self.position, t)

    def latest(self, target: str) -> Snapshot:
        """The newest snapshot of ``target`` played so far."""
        snap = self._latest.get(target)
        if snap is None:
            raise SourceError(f"{target}: not yet in the recording")
        return snap

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class ReplaySource:
    """One recorded target, as a dashboard source."""

    #: Not a live target: no fetch latency to show.
    live = False

    def __init__(self, player: Player, name: str) -> None:
        self.player = player
        self.name = name

    def fetch(self) -> Snapshot:
        """The newest played snapshot of this target."""
        return self.player.latest(self.name)


def _open(path: Path, mode: str) -> IO[str]:
    """A recording as text: gzip-compressed where its name ends in .gz."""
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return path.open(mode, encoding="utf-8")
