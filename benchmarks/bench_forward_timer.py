"""The forward timer's cost per engine step: a runner's ``_model_forward`` wrapped by
:mod:`specscope.engine.forward_timer` against the same method unwrapped (the call's own cost, nothing in it),
and as a share of the smallest decode step specscope is tested on (the tiny target's at batch 8, 1.67 ms in
``record.json``: its worst case; the stat logger's own record() is 0.16% of it). The wrapped runner publishes its
sums as in an engine (a daemon thread, four times a second).
Goal: <= 0.5% of a decode step.
Run: python benchmarks/bench_forward_timer.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import paired_ns, write

#: The tiny target's decode step at batch 8 (benchmarks/results/record.json, timed on a real engine by
#: bench_record.py): the smallest step specscope is tested on, where the timer's share is largest.
SMALLEST_STEP_S = 0.00167


def runner_class() -> type:
    class Runner:
        def __init__(self) -> None:
            self.device = SimpleNamespace(type="cpu")
            self.input_batch = SimpleNamespace(num_reqs=8)
            self.parallel_config = SimpleNamespace(rank=0, tensor_parallel_size=1, data_parallel_rank=0)

        def _model_forward(self, input_ids: Any = None, positions: Any = None, **kw: Any) -> Any:
            return positions

    return Runner


def main() -> None:
    from specscope.engine import forward_timer

    positions = SimpleNamespace(shape=(40,))
    plain_cls, timed_cls = runner_class(), runner_class()
    with tempfile.TemporaryDirectory() as where:
        os.environ[forward_timer.ENV] = where
        assert forward_timer.wrap(timed_cls)
        plain, timed = plain_cls(), timed_cls()
        base_ns, ours_ns, ratio = paired_ns(lambda: plain._model_forward(input_ids=None, positions=positions),
                                            lambda: timed._model_forward(input_ids=None, positions=positions),
                                            20000)
        time.sleep(2 * forward_timer.PUBLISH_S)
        sums = forward_timer.read(Path(where) / "0.forward.json")
        assert sums and set(sums) == {(8, 5)}, sums  # timed and published as in an engine: 8 requests of 5 tokens
    added_ns = max(0.0, ours_ns - base_ns)
    share = added_ns * 1e-9 / SMALLEST_STEP_S
    doc = {"unwrapped_ns": round(base_ns), "wrapped_ns": round(ours_ns), "ratio": round(ratio, 2),
           "added_ns_per_step": round(added_ns), "smallest_step_ms": 1e3 * SMALLEST_STEP_S,
           "share_of_smallest_step": round(share, 5), "goal": "<= 0.5% of a decode step",
           "met": share <= 0.005}
    write("forward_timer", doc)


if __name__ == "__main__":
    main()
