"""Frame cost of `specscope top` with 1,000 requests in the table and 8 targets.

One frame = redrawing every panel and the fleet from the targets' state, plus Textual laying out and painting the
screen (Pilot, headless, at 120x40 and 160x50), counted in CPU time (Pilot's pause also waits idle, which is not
frame cost).
Before each frame every engine runs a second more (new numbers for every panel and fleet row) and the shown
engine's 1,000 requests change, so nothing can be skipped; polling (a worker thread's job) is not counted.
Baseline in the same run: the same rows put into Textual's DataTable (clear + add_rows), the obvious way to
build the table. Goal: a frame under 16 ms. Run: python benchmarks/bench_frame.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from textual.widgets import DataTable

from benchmarks._common import write
from specscope.read.fleet import Target
from specscope.read.scrape import HubSource
from specscope.read.tui import view
from specscope.read.tui.app import TopApp
from tests.read.tui.helpers import Clock, busy_hub, feed

FRAMES = 100


async def measure(size: tuple[int, int]) -> dict[str, float]:
    clock = Clock()
    hubs = [busy_hub(clock, requests=1000) for _ in range(8)]
    targets = [Target(HubSource(h, f"engine-{i}")) for i, h in enumerate(hubs)]
    app = TopApp(targets, interval=0)
    async with app.run_test(size=size) as pilot:
        app.poll_now()
        for t in targets:
            t.poll()
        app.refresh_view()
        await pilot.pause()
        cur = app.current
        assert cur.snapshot is not None and len(cur.snapshot.requests) == 1000
        variants = [cur.snapshot, dataclasses.replace(cur.snapshot, requests=cur.snapshot.requests[::-1])]
        frames = []
        for i in range(FRAMES):
            for n, hub in enumerate(hubs):
                feed(hub, clock, 1, accepted_of_4=i % 4, start=2000 + 10 * i + n)
            app.poll_now()
            cur.snapshot = dataclasses.replace(cur.snapshot, requests=variants[i % 2].requests)
            t0 = time.process_time()
            app.refresh_view()
            await pilot.pause()
            frames.append(time.process_time() - t0)
        table: DataTable[str] = DataTable()
        await app.mount(table)
        baseline = []
        for i in range(FRAMES // 3):
            rows = [tuple(col[3](r) for col in view.COLUMNS)
                    for r in view.select_requests(variants[i % 2].requests, 0, False, "")]
            t0 = time.process_time()
            table.clear(columns=True)
            table.add_columns(*(c[0] for c in view.COLUMNS))
            table.add_rows(rows)
            await pilot.pause()
            baseline.append(time.process_time() - t0)
    return {"frame_ms": 1e3 * statistics.median(frames), "frame_p90_ms": 1e3 * sorted(frames)[int(0.9 * FRAMES)],
            "datatable_rows_only_ms": 1e3 * statistics.median(baseline)}


def main() -> None:
    out: dict[str, object] = {"targets": 8, "requests_in_table": 1000, "frames": FRAMES, "goal_ms": 16}
    for w, h in ((120, 40), (160, 50)):
        r = asyncio.run(measure((w, h)))
        out[f"{w}x{h}"] = {
            "frame_ms": round(r["frame_ms"], 2),
            "frame_p90_ms": round(r["frame_p90_ms"], 2),
            "baseline_datatable_rows_only_ms": round(r["datatable_rows_only_ms"], 2),
            "baseline_over_frame": round(r["datatable_rows_only_ms"] / r["frame_ms"], 1),
        }
    write("frame", out)


if __name__ == "__main__":
    main()
