"""The target model's forward pass, timed in the process that runs it: the machine's speed now, which the verdict
prices a plain step from (docs/speed-anchor.md).

:func:`install` (vLLM's ``vllm.general_plugins`` entry point, through :mod:`specscope.plugin`) wraps the V1
``GPUModelRunner._model_forward`` at class level once its module is imported (``CPUModelRunner`` inherits it;
warm-up and profile runs call the model directly, so only real steps are timed). Each call adds its seconds to a
running sum keyed by (requests in the batch, tokens it ran): a plain decode step at batch b is (b, b), a speculative
one at K is (b, b·(K+1)). A daemon thread writes the sums about four times a second to
``<dir>/<engine index>.forward.json`` (ours, 0600, a fresh ``O_EXCL|O_NOFOLLOW`` file renamed over the last), and
the stat logger in the front-end process reads them (:class:`ForwardDeltas`): vLLM's stats drop fields it does not
declare. The directory is
``SPECSCOPE_FORWARD_DIR`` (``specscope.LLM`` names a fresh one per engine), else ``forward/`` in the server's share
directory (:mod:`specscope.share`); without either nothing is timed.

On CPU every op is synchronous and ``perf_counter`` around the call is the forward's time. On CUDA the call returns
after launching kernels: no time is taken there (absent, never a wrong number); Model Runner V2 (CUDA's default) has
no ``_model_forward`` and is left alone. A failure turns the wrapper into a pass-through: it never raises into the
engine.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specscope import private

log = logging.getLogger("specscope")

#: Where the front end asks the engine's processes to publish (a private directory it made).
ENV = "SPECSCOPE_FORWARD_DIR"
#: Seconds between two writes of the sums.
PUBLISH_S = 0.25
_MARK = "_specscope_forward_timer"
perf_counter = time.perf_counter


class ForwardSums:
    """Running sums of timed forwards by (requests, tokens): count and seconds; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[tuple[int, int], list[float]] = {}
        self.version = 0

    def add(self, requests: int, tokens: int, seconds: float) -> None:
        with self._lock:
            row = self._sums.get((requests, tokens))
            if row is None:
                row = self._sums[(int(requests), int(tokens))] = [0, 0.0]
            row[0] += 1
            row[1] += seconds
            self.version += 1

    def rows(self) -> list[list[float]]:
        """``[requests, tokens, count, seconds]`` for each key, sorted."""
        with self._lock:
            return [[r, t, int(c), s] for (r, t), (c, s) in sorted(self._sums.items())]


class Publisher:
    """Writes one process's :class:`ForwardSums` to its file in ``directory`` every :data:`PUBLISH_S` from a daemon
    thread, while they change."""

    def __init__(self, directory: Path, name: str, sums: ForwardSums) -> None:
        self.directory, self.path, self.sums = directory, directory / name, weakref.ref(sums)
        self._written = -1
        self._thread = threading.Thread(target=self._loop, name="specscope-forward", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            time.sleep(PUBLISH_S)
            try:
                if not self.publish():
                    return
            except OSError as e:  # the directory went away or was tampered with: stop, never raise
                log.warning("specscope: forward times not published (%s)", e)
                return

    def publish(self) -> bool:
        """Write the sums now if they changed since the last write; False once their runner is gone."""
        sums = self.sums()
        if sums is None:
            return False
        version = sums.version
        if version == self._written:
            return True
        private.replace_file(self.path, json.dumps({"pid": os.getpid(), "sums": sums.rows()}).encode())
        self._written = version
        return True


def read(path: Path) -> list[tuple[int, int, int, float]] | None:
    """The sums a :class:`Publisher` wrote to ``path``: (requests, tokens, count, seconds) rows; None where the file
    is absent, not private to us or not what a publisher writes."""
    try:
        fd = private.open_private(path, os.O_RDONLY)
    except OSError:  # PermissionError too: not ours
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            doc = json.loads(f.read(1 << 20))
        return [(int(r), int(t), int(c), float(s)) for r, t, c, s in doc["sums"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def named() -> Path | None:
    """The directory engines of this process's server publish to: ``SPECSCOPE_FORWARD_DIR``, else ``forward/`` in
    the server's share directory; None where neither is named."""
    from specscope import share

    where = os.environ.get(ENV)
    if where:
        return Path(where)
    try:
        return share.default_directory() / "forward"
    except OSError:
        return None


def directory() -> Path | None:
    """:func:`named`, made private if absent (and its share directory with it); None where none is named or one is
    not ours."""
    where = named()
    try:
        if where is not None and not os.environ.get(ENV):
            private.private_directory(where.parent)
        return None if where is None else private.private_directory(where, "forward-time directory")
    except OSError as e:
        log.warning("specscope: the target's forward is not timed (%s)", e)
        return None


@contextlib.contextmanager
def engine_directory() -> Iterator[None]:
    """While an engine starts in this process (``specscope.LLM``, ``AsyncLLM``): a fresh private directory named in
    ``SPECSCOPE_FORWARD_DIR``, which the engine's processes inherit and its stat logger reads, so that two engines
    of one process never share one; removed when the process exits. One the user named is kept."""
    if os.environ.get(ENV):
        yield
        return
    where = tempfile.mkdtemp(prefix="specscope-forward-")
    atexit.register(shutil.rmtree, where, True)
    os.environ[ENV] = where
    try:
        yield
    finally:
        os.environ.pop(ENV, None)


def wrap(runner_cls: type) -> bool:
    """Wrap ``runner_cls`` (once) so that each runner it makes times its forwards into sums published to the
    :func:`directory` named when it was made (an engine in the caller's process starts inside
    :func:`engine_directory`); False where the class has no ``_model_forward`` (Model Runner V2) or is wrapped
    already."""
    forward, init = runner_cls.__dict__.get("_model_forward"), runner_cls.__dict__.get("__init__")
    if forward is None or init is None or getattr(forward, _MARK, False):
        return False

    @functools.wraps(init)
    def started(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        sums = None
        try:
            par = self.parallel_config
            where = directory() if self.device.type == "cpu" and \
                getattr(par, "rank", 0) % max(1, getattr(par, "tensor_parallel_size", 1)) == 0 else None
            if where is not None:  # on CUDA kernels still run when the call returns: no time to take
                sums = ForwardSums()
                # The engine's index (vLLM's engine_idx): a dense model's DP engines all have data_parallel_rank 0.
                index = getattr(par, "data_parallel_index", None)
                Publisher(where, f"{int(par.data_parallel_rank if index is None else index)}.forward.json", sums)
        except Exception as e:  # never raise into the engine
            log.warning("specscope: the target's forward is not timed (%s)", e)
            sums = None
        self._specscope_forward_sums = sums

    @functools.wraps(forward)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        sums = getattr(self, "_specscope_forward_sums", None)
        if sums is None:
            return forward(self, *args, **kwargs)
        t0 = perf_counter()
        out = forward(self, *args, **kwargs)
        seconds = perf_counter() - t0
        try:  # noqa: SIM105 (contextlib.suppress costs a third of the timer's cost per step)
            sums.add(self.input_batch.num_reqs, kwargs["positions"].shape[-1], seconds)
        except Exception:  # never raise into the engine
            pass
        return out

    setattr(timed, _MARK, True)
    runner_cls.__init__ = started  # type: ignore[misc]
    runner_cls._model_forward = timed  # type: ignore[attr-defined]
    return True


def install() -> None:
    """Wrap vLLM's V1 model runner once its module is imported in this process (a post-import hook: the front end,
    which never imports it, pays nothing)."""
    try:
        import wrapt

        wrapt.register_post_import_hook(_wrap_module, "vllm.v1.worker.gpu_model_runner")
    except Exception as e:  # a plugin that fails must not stop vLLM
        log.warning("specscope: the target's forward is not timed (%s)", e)


def _wrap_module(module: Any) -> None:
    try:
        wrap(module.GPUModelRunner)
    except Exception as e:
        log.warning("specscope: the target's forward is not timed (%s)", e)


class ForwardDeltas:
    """The forwards each engine published since the last :meth:`since` (the stat logger's reader in the front
    end)."""

    def __init__(self, where: Path) -> None:
        self.directory = where
        self._last: dict[int, dict[tuple[int, int], tuple[int, float]]] = {}

    def since(self, engine: int) -> list[tuple[int, int, int, float]]:
        """``(requests, tokens, count, seconds)`` added since the last call for ``engine``; [] where nothing was
        read."""
        rows = read(self.directory / f"{engine}.forward.json")
        if rows is None:
            return []
        last = self._last.get(engine, {})
        now = {(r, t): (c, s) for r, t, c, s in rows}
        if any(now.get(key, (0, 0.0))[0] < c for key, (c, _) in last.items()):
            last = {}  # the engine's process restarted: its sums began again
        self._last[engine] = now
        out = []
        for (r, t), (c, s) in now.items():
            c0, s0 = last.get((r, t), (0, 0.0))
            if c > c0 and r > 0:
                out.append((r, t, c - c0, s - s0))
        return out
