"""specscope's own health: its failures, the vLLM fields it misses and the records it drops, counted."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from specscope.core.model import Health

log = logging.getLogger("specscope")

#: Where a failure is counted: ``(where, exception)``, as :meth:`HealthLog.count_error` takes them.
ErrorSink = Callable[[str, BaseException], None]


class HealthLog:
    """Thread-safe counts for the snapshot's :class:`~specscope.core.model.Health` and ``unavailable``; each kind of
    failure is logged the first time only, and nothing here raises."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: dict[str, int] = {}
        self._unavailable: set[str] = set()
        self._last_error: str | None = None
        self._dropped = 0

    def count_error(self, where: str, exc: BaseException) -> None:
        """Count a failure of specscope's own code; log it the first time it happens at ``where``."""
        with self._lock:
            n = self._errors.get(where, 0) + 1
            self._errors[where] = n
            self._last_error = f"{where}: {type(exc).__name__}: {exc}"
        if n == 1:
            log.warning("specscope: %s failed (%s: %s); counting further failures silently", where,
                        type(exc).__name__, exc)

    def count_missing(self, fields: Sequence[str], unavailable: Iterable[str] = ()) -> None:
        """Count numbers vLLM's stats no longer carry (a renamed field); log each field the first time. The
        snapshot's numbers they leave unknown (``unavailable``) are None in every snapshot from now on."""
        first = []
        with self._lock:
            self._unavailable.update(unavailable)
            for name in fields:
                key = f"vllm field {name}"
                n = self._errors.get(key, 0) + 1
                self._errors[key] = n
                if n == 1:
                    first.append(name)
                    self._last_error = f"{key}: missing from this vLLM's stats"
        for name in first:
            log.warning("specscope: vLLM's stats have no %s; that number is unavailable, the rest is recorded "
                        "(counting further misses silently)", name)

    def count_dropped(self) -> None:
        """Count a finished request the listeners' full queue had no room for."""
        with self._lock:
            self._dropped += 1

    def freeze(self) -> Health:
        """The counts so far."""
        with self._lock:
            return Health(errors=tuple(sorted(self._errors.items())), dropped_records=self._dropped,
                          last_error=self._last_error)

    def unavailable(self) -> tuple[str, ...]:
        """The snapshot's numbers that a missing vLLM field leaves unknown."""
        with self._lock:
            return tuple(sorted(self._unavailable))
