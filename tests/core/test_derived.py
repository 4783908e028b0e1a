"""Figures derived from a snapshot: computed once per snapshot, kept beside it (the snapshot stays a value), gone
with it."""

from __future__ import annotations

import gc
from dataclasses import fields, replace

from specscope.core import codec, derived
from specscope.core.model import Snapshot
from specscope.state.hub import Hub


def test_a_figure_is_computed_once_per_snapshot_and_goes_with_it() -> None:
    calls: list[int] = []
    snap = Hub().snapshot()
    before = derived.tables()
    assert derived.once(snap, "x", lambda: calls.append(1) or 41) == 41
    assert derived.once(snap, "x", lambda: calls.append(1) or 42) == 41 and calls == [1]
    changed = replace(snap, time=snap.time + 1)
    assert derived.once(changed, "x", lambda: 43) == 43  # a changed snapshot starts afresh
    assert derived.tables() == before + 2
    del snap, changed
    gc.collect()
    assert derived.tables() == before


def test_the_snapshot_holds_no_cache() -> None:
    snap = Hub().snapshot()
    derived.once(snap, "x", lambda: 1)
    assert "derived" not in {f.name for f in fields(Snapshot)}
    assert codec.from_dict(codec.to_dict(snap)) == snap and "derived" not in codec.to_dict(snap)
