"""Memory over a long replay: traced Python memory after 2,000 and after 20,000 recorded snapshots.

The recording (made here with the Recorder, one snapshot per second of a busy engine with new requests every
second) is read as it plays, and the dashboard's state keeps bounded history, so memory must stay flat.
Ratio: memory after 20,000 snapshots / after 2,000. Run: python benchmarks/bench_replay_memory.py
"""

from __future__ import annotations

import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write
from specscope.read.fleet import Target
from specscope.read.tui.record import Player, Recorder, ReplaySource
from tests.read.tui.helpers import Clock, busy_hub, feed

SNAPSHOTS = 20_000


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.jsonl"
        clock = Clock()
        hub = busy_hub(clock, requests=10)
        rec = Recorder(path, max_bytes=1 << 34)
        for i in range(SNAPSHOTS):
            feed(hub, clock, 1, accepted_of_4=i % 5, start=10 + i)  # one new request per second
            rec.write("engine", hub.snapshot())
        rec.close()
        size_mb = path.stat().st_size / 1e6
        gc.collect()
        tracemalloc.start()
        player = Player(path)
        target = Target(ReplaySource(player, "engine"))
        marks = {}
        for i in range(1, SNAPSHOTS + 1):
            player.step()
            target.poll()
            target.evaluate(60)
            if i in (SNAPSHOTS // 10, SNAPSHOTS):
                gc.collect()
                marks[i] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        player.close()
    early, late = marks[SNAPSHOTS // 10], marks[SNAPSHOTS]
    write("replay_memory", {
        "recording_mb": round(size_mb, 1),
        "snapshots": SNAPSHOTS,
        f"traced_kb_after_{SNAPSHOTS // 10}": round(early / 1024),
        f"traced_kb_after_{SNAPSHOTS}": round(late / 1024),
        "ratio": round(late / early, 3),
    })


if __name__ == "__main__":
    main()
