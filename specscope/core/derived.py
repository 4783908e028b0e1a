"""Figures derived from an immutable object, computed once per object and kept beside it, never in it: every
reader of one snapshot (exporters, alert rules, the dashboard's panels) shares one computation of the verdict,
the snapshot stays a value (compared, encoded and replaced by its fields alone), and a snapshot made by
``replace`` starts afresh. A table lives as long as its object."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_TABLES: dict[int, dict[Hashable, Any]] = {}
_LOCK = threading.Lock()


def once(obj: object, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` the first time ``key`` is asked of ``obj`` (which must take weak references), the same value
    after. Two threads asking at once may both compute it (the verdict is deterministic); one is kept."""
    ident = id(obj)
    table = _TABLES.get(ident)
    if table is None:
        with _LOCK:
            table = _TABLES.get(ident)
            if table is None:
                table = _TABLES[ident] = {}
                weakref.finalize(obj, _TABLES.pop, ident, None)
    try:
        return table[key]
    except KeyError:
        return table.setdefault(key, compute())


def tables() -> int:
    """How many objects have figures kept (for tests: a table goes with its object)."""
    return len(_TABLES)
