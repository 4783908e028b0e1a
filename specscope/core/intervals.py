"""One algebra for interval counts (:class:`~specscope.core.model.Totals` and what it holds): the sum of two
processes' counts over the same interval (:func:`add`), and the counts between two lifetime readings of one
engine (:func:`since`).

Every field is a count unless its dataclass metadata says otherwise (``combine``): ``span`` (the interval's
length: the longer when adding, the difference when subtracting), ``keep`` (a setting: the larger when adding,
the later reading's when subtracting), ``key`` (what rows are matched by), ``mean`` (weighted by the field named
in ``weight``). Tuples add position by position; a count that is None on either side is None; a nested record
absent on one side is the other's (adding) or the later reading's (subtracting).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

from specscope.core.model import StepProfile, StepTime

T = TypeVar("T")


def add(a: T, b: T) -> T:
    """``a`` and ``b`` counted over the same interval by two processes, as one."""
    return _combine(a, b, 1)


def since(later: T, earlier: T) -> T:
    """The counts of ``later`` that came after ``earlier`` (two lifetime readings of one engine)."""
    return _combine(later, earlier, -1)


def _combine(a: Any, b: Any, sign: int) -> Any:
    if a is None or b is None:
        return (a if a is not None else b) if sign > 0 else a
    if isinstance(a, StepProfile):
        return _profiles(a, b, sign)
    if isinstance(a, tuple):
        n = max(len(a), len(b))
        return tuple((a[i] if i < len(a) else 0) + sign * (b[i] if i < len(b) else 0) for i in range(n))
    if is_dataclass(a):
        values: dict[str, Any] = {}
        for f in fields(a):
            x, y, how = getattr(a, f.name), getattr(b, f.name), f.metadata.get("combine")
            if how == "key":
                values[f.name] = x
            elif how == "keep":
                values[f.name] = max(x, y) if sign > 0 else x
            elif how == "span":
                values[f.name] = max(x, y) if sign > 0 else x - y
            elif how != "mean":
                values[f.name] = _combine(x, y, sign) if is_dataclass(x) or isinstance(x, (tuple, StepProfile)) \
                    else None if x is None or y is None else x + sign * y
        for f in fields(a):  # means, once their weights are combined
            if f.metadata.get("combine") == "mean":
                w = f.metadata["weight"]
                total = values[w]
                values[f.name] = ((getattr(a, w) * getattr(a, f.name) + sign * getattr(b, w) * getattr(b, f.name))
                                  / total if total > 0 else 0.0)
        cls: Any = type(a)
        return cls(**values)
    return a + sign * b


def _profiles(a: StepProfile, b: StepProfile, sign: int) -> StepProfile:
    """Step times by batch size: matched rows combined (subtracting drops a batch size with no new steps), and the
    forward's fit sums."""
    other = {t.batch_size: t for t in b.times}
    rows: dict[int, StepTime] = {}
    for t in a.times:
        o = other.pop(t.batch_size, None)
        if o is None:
            rows[t.batch_size] = t
            continue
        row = _combine(t, o, sign)
        if sign < 0:
            if row.steps <= 0 and row.prefill_steps <= 0:
                continue
            row = replace(row, steps=max(0, row.steps))
        rows[t.batch_size] = row
    if sign > 0:
        rows.update(other)
    return StepProfile(tuple(rows[k] for k in sorted(rows)), a.source, a.setup,
                       _combine(a.forward_moments, b.forward_moments, sign))
