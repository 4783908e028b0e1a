"""The cost of capturing traffic as training data (specscope.engine.capture), per captured request.

On vLLM's path (the output processor's hook and the stat logger's flush) capture adds, per finished request, one
:class:`~specscope.engine.capture.Payload` of references and one :meth:`~specscope.engine.capture.Capture.hold` (a dict
insert).
Measured against what specscope already pays per finished request there (the hub's ``record`` of its part), and as
a share of the tiny target's decode step at batch 8 (benchmarks/results/record.json, the cheapest step specscope is
tested on). Off vLLM's path, the writer's thread: choosing, building the row (a 200-token prompt, a 64-token
completion) and writing it, per row, in microseconds of one core.
Goals: on vLLM's path <= 0.5% of a decode step per captured request; the writer >= 2,000 rows/s on one core.
Run: python benchmarks/bench_capture.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS, paired_ns, write
from specscope.engine.capture import Capture, CaptureConfig, Payload
from specscope.state.hub import Hub


def main() -> None:
    prompt, output, text = list(range(200)), list(range(64)), "word " * 64
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(max_requests=100_000)
        cap = Capture(CaptureConfig(Path(tmp) / "capture", ("code",)), hub)
        n = [0]

        def record() -> None:
            n[0] += 1
            hub.requests.record(f"r{n[0]}", traffic_class="chat", prompt_tokens=200, generation_tokens=64,
                                spec_steps=20, draft_tokens=80, accepted_tokens=44)

        def hold() -> None:
            n[0] += 1
            cap.hold(f"h{n[0]}", Payload("prompt", prompt, output, text, None, None))

        record_ns, hold_ns, ratio = paired_ns(record, hold, 2000)
        hub.requests.wait_idle(30)
        cap.close()

        hub = Hub(max_requests=100_000)
        cap = Capture(CaptureConfig(Path(tmp) / "rows", ("code",)), hub)
        rows = 3000
        t0 = time.process_time()
        for i in range(rows):
            cap.hold(f"w{i}", Payload("prompt", prompt, output, text, None, None))
            hub.requests.record(f"w{i}", traffic_class="code", prompt_tokens=200, generation_tokens=64,
                                spec_steps=20, draft_tokens=80, accepted_tokens=44)
        hub.requests.wait_idle(60)
        cap.close()
        cpu_s = time.process_time() - t0
        written, behind = cap.status().rows, cap.status().dropped_behind
    step_us = json.loads((RESULTS / "record.json").read_text())["tiny_target_decode_step_us_at_batch_8"]
    write("capture", {
        "hold_us": round(hold_ns / 1000, 3), "record_us": round(record_ns / 1000, 3),
        "ratio_hold_over_record": round(ratio, 3),
        "tiny_target_decode_step_us_at_batch_8": step_us,
        "share_of_a_decode_step_per_captured_request": round(hold_ns / 1000 / step_us, 5),
        "rows_written": written, "rows_dropped_behind": behind,
        "rows_written_per_cpu_second": round(written / cpu_s),
        "method": "hold vs the hub's record of a request: median of 15 alternating rounds of 2000 calls; the "
                  "writer: CPU time of the whole process (recording, choosing, building and writing) over 3000 "
                  "requests of a captured class, recorded as fast as one thread can (rows past the writer's full "
                  "queue are dropped and counted: the writer never holds the engine back)",
        "goal": "share of a decode step <= 0.005 per captured request; >= 2000 rows per CPU second",
    })


if __name__ == "__main__":
    main()
