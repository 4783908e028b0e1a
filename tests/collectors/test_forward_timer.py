"""The forward timer on a runner shaped as vLLM's V1 one (the class-level wrap, the sums, the private file, the
front end's reader); on a real engine in tests/engine/test_calibrate.py."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specscope.collectors import forward_timer
from specscope.counts import FORWARDS, Counts


def runner_class() -> type:
    class Runner:
        def __init__(self, requests: int, device: str = "cpu") -> None:
            self.device = SimpleNamespace(type=device)
            self.input_batch = SimpleNamespace(num_reqs=requests)
            # A dense model's second data-parallel engine: vLLM 0.32 resets its rank to 0, the index stays.
            self.parallel_config = SimpleNamespace(rank=0, tensor_parallel_size=1, data_parallel_rank=0,
                                                   data_parallel_index=1)
            self.calls = 0

        def _model_forward(self, input_ids: Any = None, positions: Any = None, **kw: Any) -> str:
            self.calls += 1
            time.sleep(0.01)
            return "hidden"

    return Runner


def positions(tokens: int) -> Any:
    return SimpleNamespace(shape=(tokens,))


def wait_for(path: Path, count: int) -> list[tuple[int, int, int, float]]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        rows = forward_timer.read(path)
        if rows and sum(r[2] for r in rows) >= count:
            return rows
        time.sleep(0.02)
    raise AssertionError(forward_timer.read(path))


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward_timer, "PUBLISH_S", 0.02)
    monkeypatch.delenv(forward_timer.ENV, raising=False)


def test_each_forward_is_summed_by_batch_and_tokens_published_privately_and_read_as_deltas(fast: None) -> None:
    cls = runner_class()
    assert forward_timer.wrap(cls) and not forward_timer.wrap(cls)  # once
    with forward_timer.engine_directory():  # as specscope.LLM starts its engine
        where = forward_timer.named()
        runner = cls(4)  # one engine's runner: one file
    assert where is not None and forward_timer.ENV not in os.environ and os.stat(where).st_mode & 0o077 == 0
    reader = forward_timer.ForwardDeltas(where)
    for _ in range(3):
        assert runner._model_forward(input_ids=None, positions=positions(4)) == "hidden"
    runner._model_forward(positions=positions(20))  # batch 4 at K = 4: 20 tokens
    runner._model_forward(positions=positions(4 + 37))  # a prompt of 38 tokens joining three decoding requests
    path = where / "1.forward.json"
    rows = wait_for(path, 5)
    by_key = {(r, t): (c, s) for r, t, c, s in rows}
    assert set(by_key) == {(4, 4), (4, 20), (4, 41)} and by_key[(4, 4)][0] == 3 and by_key[(4, 20)][0] == 1
    assert 0.03 <= by_key[(4, 4)][1] < 0.3 and 0.01 <= by_key[(4, 20)][1] < 0.1  # 10 ms a call
    assert os.stat(path).st_mode & 0o077 == 0
    first = reader.since(1)
    assert {(r, t): c for r, t, c, _ in first} == {(4, 4): 3, (4, 20): 1, (4, 41): 1}
    # Into an interval's counts at K = 4: the decode forwards at batch 4, the prompt's into the fit's sums only.
    counts = Counts()
    counts.add_forwards(first, 5)
    assert counts.batches[4][FORWARDS] == 4 and counts.moments[0] == 5
    runner._model_forward(positions=positions(4))
    wait_for(path, 6)
    assert [(r, t, c) for r, t, c, _ in reader.since(1)] == [(4, 4, 1)]  # only what is new
    assert reader.since(0) == []  # no such engine
    os.chmod(path, 0o644)  # a file others can read is never taken
    assert forward_timer.read(path) is None and reader.since(1) == []


def test_a_gpu_runner_or_one_with_no_directory_passes_through_untimed(fast: None, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cls = runner_class()
    forward_timer.wrap(cls)
    monkeypatch.setenv(forward_timer.ENV, str(tmp_path / "fw"))
    gpu = cls(2, device="cuda")
    assert gpu._model_forward(positions=positions(2)) == "hidden" and gpu.calls == 1
    monkeypatch.delenv(forward_timer.ENV)
    monkeypatch.delenv("SPECSCOPE_SHARE_DIR", raising=False)
    monkeypatch.delenv("SPECSCOPE_SERVER_SHARE_DIR", raising=False)
    alone = cls(2)  # nothing names a directory: nothing is timed
    assert alone._model_forward(positions=positions(2)) == "hidden" and alone.calls == 1
    time.sleep(0.1)
    assert not (tmp_path / "fw").exists()


def test_a_directory_that_is_not_ours_is_refused(fast: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "open"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv(forward_timer.ENV, str(shared))
    cls = runner_class()
    forward_timer.wrap(cls)
    runner = cls(1)
    assert runner._model_forward(positions=positions(1)) == "hidden"
    time.sleep(0.1)
    assert list(shared.iterdir()) == []
