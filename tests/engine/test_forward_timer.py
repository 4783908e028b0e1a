"""The forward timer on a runner shaped as vLLM's V1 one (the class-level wrap, the sums, the private file, the
front end's reader); on a real engine in tests/e2e/test_calibrate.py."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specscope.core.counts import FIT_TOKENS_PER_REQUEST, FORWARD_S, FORWARD_TOKENS, FORWARDS, Counts
from specscope.engine import forward_timer


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


def wait_for(path: Path, count: int) -> dict[tuple[int, int], tuple[int, float, int, int]]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sums = forward_timer.read(path)
        if sums and sum(c for c, *_ in sums.values()) >= count:
            return sums
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
    by_key = wait_for(path, 5)  # keyed by (requests, tokens a request rounded up)
    assert set(by_key) == {(4, 1), (4, 5), (4, 11)} and by_key[(4, 1)][0] == 3 and by_key[(4, 5)][0] == 1
    assert 0.03 <= by_key[(4, 1)][1] < 0.3 and 0.01 <= by_key[(4, 5)][1] < 0.1  # 10 ms a call
    assert by_key[(4, 11)][2:] == (4, 41)  # its requests and tokens, summed
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
    os.chmod(path, 0o644)  # a file others can read is never taken, and that is said (once)
    with pytest.raises(PermissionError):
        forward_timer.read(path)
    with pytest.raises(PermissionError):
        reader.since(1)
    assert reader.since(1) == []


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


def test_bucket_edges_keep_decode_forwards_and_the_fits_limit_apart() -> None:
    """Every forward of a key is on one side of ``r·(K+1)`` for each K up to 15 and of the fit's limit, so the
    verdict sorts a key's forwards as it sorted each shape."""
    assert FIT_TOKENS_PER_REQUEST & (FIT_TOKENS_PER_REQUEST - 1) == 0  # a power of two: an edge of the buckets
    assert forward_timer.EXACT_PER_REQUEST < FIT_TOKENS_PER_REQUEST <= forward_timer.MAX_PER_REQUEST
    for r in (1, 3, 17, 255):
        for limit in [r * (k + 1) for k in range(16)] + [r * FIT_TOKENS_PER_REQUEST]:
            assert forward_timer.shape_key(r, limit) != forward_timer.shape_key(r, limit + 1)
    requests = {forward_timer.shape_key(r, r)[0] for r in range(1, 1 << 18)}
    per_request = {forward_timer.shape_key(1, t)[1] for t in range(1 << 12)}
    assert len(requests) * len(per_request) == forward_timer.MAX_KEYS


def test_a_flood_of_shapes_keeps_bounded_keys_a_readable_file_and_the_verdicts_sums(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: one key per (requests, tokens) grew without bound; past 1 MiB the file stopped being read. 100 000
    distinct shapes: keys within MAX_KEYS, a file well under the limit, read back, and the sums the verdict takes
    (each batch size's decode forwards, the fit's moments) as if every shape had been kept."""
    monkeypatch.setattr(forward_timer, "PUBLISH_S", 3600)  # the test publishes
    where = tmp_path / "fw"
    where.mkdir(mode=0o700)
    sums = forward_timer.ForwardSums()
    publisher = forward_timer.Publisher(where, "0.forward.json", sums)
    rng = random.Random(48)
    shapes = [(r, t, 1, rng.uniform(0.001, 0.1)) for r in range(1, 251) for t in range(r, r + 400)]
    large = [(r, t, 1, 0.5) for r in (256, 300, 5000, 70_000) for t in (r, 3 * r, 10 ** 7)]  # bucketed requests
    for r, t, _, s in shapes + large:
        sums.add(r, t, s)
    sums.add(0, 0, 1.0)  # a dummy run: no requests, not a forward the verdict prices
    assert publisher.publish()
    path = where / "0.forward.json"
    assert len(shapes) == 100_000 and path.stat().st_size < forward_timer.MAX_BYTES // 2
    published = forward_timer.read(path)
    assert published is not None and len(published) <= forward_timer.MAX_KEYS
    rows = forward_timer.ForwardDeltas(where).since(0)
    fed = shapes + large
    for i, total in ((2, sum(c for _, _, c, _ in fed)), (1, sum(t * c for _, t, c, _ in fed))):
        assert sum(row[2] * (row[1] if i == 1 else 1) for row in rows) == total  # counts and tokens: exact
    assert sum(row[3] for row in rows) == pytest.approx(sum(s for *_, s in fed))
    mine, every = Counts(), Counts()
    mine.add_forwards([row for row in rows if row[0] < forward_timer.EXACT_REQUESTS], 5)
    every.add_forwards(shapes, 5)
    assert mine.batches.keys() == every.batches.keys()
    for b, row in every.batches.items():
        assert mine.batches[b][FORWARDS] == row[FORWARDS] and mine.batches[b][FORWARD_TOKENS] == row[FORWARD_TOKENS]
        assert mine.batches[b][FORWARD_S] == pytest.approx(row[FORWARD_S])
    exact = (0, 1, 2, 3, 4, 6, 7)  # n, Σr, Σt, Σr², Σrt, Σy, Σry
    assert [mine.moments[i] for i in exact] == pytest.approx([every.moments[i] for i in exact])
    # Σt² and Σty are those of each key's mean tokens (a grouped fit): Σt² a little lower, by the spread within keys.
    assert every.moments[5] * 0.98 < mine.moments[5] <= every.moments[5]
    assert mine.moments[8] == pytest.approx(every.moments[8], rel=0.02)


def test_a_publish_encodes_only_the_keys_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward_timer, "PUBLISH_S", 3600)
    where = tmp_path / "fw"
    where.mkdir(mode=0o700)
    sums = forward_timer.ForwardSums()
    publisher = forward_timer.Publisher(where, "0.forward.json", sums)
    for r in range(1, 101):
        sums.add(r, r, 0.01)
    publisher.publish()
    encoded: list[object] = []
    monkeypatch.setattr(forward_timer, "json", SimpleNamespace(dumps=lambda x: encoded.append(x) or json.dumps(x),
                                                                      loads=json.loads))
    sums.add(7, 7, 0.01)
    publisher.publish()
    assert encoded == [[7, 1, 2, 0.02, 14, 14]]
    published = forward_timer.read(where / "0.forward.json")
    assert published is not None and len(published) == 100 and published[(7, 1)] == (2, 0.02, 14, 14)


def test_a_file_that_cannot_be_read_is_an_error_in_health_and_its_forwards_come_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: an unreadable file (over the size limit, corrupted) passed for one with nothing new. The stat
    logger counts it in health, once per version of the file, and the forwards come with the next good one."""
    pytest.importorskip("vllm")
    from specscope.engine import vllm_hook
    from specscope.engine.vllm_logger import SpecscopeStatLogger
    from specscope.state.hub import Hub

    where = tmp_path / "fw"
    where.mkdir(mode=0o700)
    monkeypatch.setenv(forward_timer.ENV, str(where))
    monkeypatch.setattr(vllm_hook, "install", lambda: False)
    hub = Hub()
    spec = SimpleNamespace(method="draft_model", num_speculative_tokens=4,
                           draft_model_config=SimpleNamespace(model="d"))
    logger = SpecscopeStatLogger.bound_to(hub)(SimpleNamespace(model_config=SimpleNamespace(model="m"),
                                                               speculative_config=spec), [0])
    path = where / "0.forward.json"

    def errors() -> int:
        return dict(hub.local_snapshot().health.errors).get("forward times", 0)

    def forwards() -> int:
        return sum(t.forwards for t in hub.local_snapshot(forwards_alone=True).lifetime.step_times.times)

    sums = forward_timer.ForwardSums()
    sums.add(2, 2, 0.01)
    publisher = forward_timer.Publisher(where, path.name, sums)
    monkeypatch.setattr(forward_timer, "PUBLISH_S", 3600)
    publisher.publish()
    logger.flush()
    assert (errors(), forwards()) == (0, 1)
    for bad in (b"{not json", b'{"pid":1,"sums":[[2,1,1,NaN,2,2]]}', b" " * (forward_timer.MAX_BYTES + 1)):
        path.unlink()
        path.write_bytes(bad)
        path.chmod(0o600)
        logger.flush()
        logger.flush()  # the same file again: not counted twice
    assert errors() == 3 and "0.forward.json" in (hub.local_snapshot().health.last_error or "")
    sums.add(2, 2, 0.01)
    publisher.publish()  # the engine's next write
    logger.flush()
    assert (errors(), forwards()) == (3, 2)
