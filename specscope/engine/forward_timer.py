"""The target model's forward pass, timed in the process that runs it: the machine's speed now, which the verdict
prices a plain step from (docs/speed-anchor.md).

:func:`install` (vLLM's ``vllm.general_plugins`` entry point, through :mod:`specscope.engine.plugin`) wraps the V1
``GPUModelRunner._model_forward`` at class level once its module is imported (``CPUModelRunner`` inherits it;
warm-up and profile runs call the model directly, so only real steps are timed). Each call adds to running sums
(count, seconds, requests, tokens) under its shape's key (:func:`shape_key`): the requests in the batch and the tokens
a request it ran, rounded up (a plain decode step at batch b is (b, 1), a speculative one at K (b, K + 1)), exact
where the verdict tells shapes apart and bucketed beyond, so that there are never more than :data:`MAX_KEYS` keys
whatever the traffic. A daemon thread writes the sums about four times a second to
``<dir>/<engine index>.forward.json`` (ours, 0600, a fresh ``O_EXCL|O_NOFOLLOW`` file renamed over the last),
encoding only the keys that changed, and the stat logger in the front-end process reads them
(:class:`ForwardDeltas`): vLLM's stats drop fields it does not declare. A file it cannot read is raised to the
stat logger, which counts it in health (``forward times``). The directory is
``SPECSCOPE_FORWARD_DIR`` (``specscope.LLM`` names a fresh one per engine), else ``forward/`` in the server's share
directory (:mod:`specscope.engine.share`); without either nothing is timed.

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

from specscope.core import private

log = logging.getLogger("specscope")

#: Where the front end asks the engine's processes to publish (a private directory it made).
ENV = "SPECSCOPE_FORWARD_DIR"
#: Seconds between two writes of the sums.
PUBLISH_S = 0.25
#: Requests in a forward kept apart exactly below this (every batch size a CPU server runs at: vLLM's
#: ``max_num_seqs`` is 128 or 256 there by default); from here four buckets a doubling, up to :data:`MAX_REQUESTS`.
EXACT_REQUESTS = 256
#: Forwards of this many requests or more share one key.
MAX_REQUESTS = 1 << 16
#: Tokens a request (rounded up) kept apart exactly up to this: a decode forward at any K up to 15 (K + 1 tokens a
#: request) never shares a key with one that ran a prompt. Above, one bucket a doubling (one edge is
#: :data:`~specscope.core.counts.FIT_TOKENS_PER_REQUEST`, the forward fit's limit) up to :data:`MAX_PER_REQUEST`.
EXACT_PER_REQUEST = 16
#: Forwards of more tokens a request than this share one key (long prompts: neither the fit nor a batch size's
#: decode forwards take them).
MAX_PER_REQUEST = 1024
#: The most keys there can be: every bucket of requests by every bucket of tokens a request.
MAX_KEYS = ((EXACT_REQUESTS - 1 + 4 * (MAX_REQUESTS.bit_length() - EXACT_REQUESTS.bit_length()) + 1)
            * (EXACT_PER_REQUEST + 1 + (MAX_PER_REQUEST.bit_length() - EXACT_PER_REQUEST.bit_length()) + 1))
#: The largest file :func:`read` takes (:data:`MAX_KEYS` rows come to under half of it).
MAX_BYTES = 1 << 20
_MARK = "_specscope_forward_timer"
perf_counter = time.perf_counter


def shape_key(requests: int, tokens: int) -> tuple[int, int]:
    """The key a forward of ``requests`` (at least 1) running ``tokens`` is summed under: (requests, tokens a request
    rounded up), each exact where small (:data:`EXACT_REQUESTS`, :data:`EXACT_PER_REQUEST`), else the bucket's
    lower edge of requests and upper edge of tokens a request. A bucket never straddles ``r·(K+1)`` for K up to 15
    nor the fit's ``r·FIT_TOKENS_PER_REQUEST``, so each key's forwards all fall on one side of both."""
    per = -(-tokens // requests)
    if per > EXACT_PER_REQUEST:
        per = 1 << (min(per, MAX_PER_REQUEST + 1) - 1).bit_length()
    if requests >= EXACT_REQUESTS:
        shift = requests.bit_length() - 3
        requests = min(requests >> shift << shift, MAX_REQUESTS)
    return requests, per


class ForwardSums:
    """Running sums of timed forwards by :func:`shape_key`: count, seconds, requests and tokens (so that each key's
    means are exact); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[tuple[int, int], list[float]] = {}
        self._changed: set[tuple[int, int]] = set()
        self.version = 0

    def add(self, requests: int, tokens: int, seconds: float) -> None:
        """Add one forward (none without requests: a dummy run)."""
        requests, tokens = int(requests), int(tokens)
        if requests < 1:
            return
        key = shape_key(requests, tokens)
        with self._lock:
            row = self._sums.get(key)
            if row is None:
                row = self._sums[key] = [0, 0.0, 0, 0]
            row[0] += 1
            row[1] += seconds
            row[2] += requests
            row[3] += tokens
            self._changed.add(key)
            self.version += 1

    def take_changed(self) -> list[tuple[tuple[int, int], list[float]]]:
        """Each key changed since the last call, with its sums as they are now: [count, seconds, requests, tokens]."""
        with self._lock:
            out = [(key, list(self._sums[key])) for key in self._changed]
            self._changed.clear()
        return out


class Publisher:
    """Writes one process's :class:`ForwardSums` to its file in ``directory`` every :data:`PUBLISH_S` from a daemon
    thread, while they change."""

    def __init__(self, directory: Path, name: str, sums: ForwardSums) -> None:
        self.directory, self.path, self.sums = directory, directory / name, weakref.ref(sums)
        self._written = -1
        self._rows: dict[tuple[int, int], str] = {}  # each key's row as last encoded
        self._thread = threading.Thread(target=self._loop, name="specscope-forward", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        failing = False
        while True:
            time.sleep(PUBLISH_S)
            try:
                if not self.publish():
                    return
                failing = False
            except OSError as e:  # a full disk, a directory gone or tampered with: said once, tried again, never raised
                if not failing:
                    log.warning("specscope: forward times not published (%s); trying again", e)
                failing = True

    def publish(self) -> bool:
        """Write the sums now if they changed since the last write, encoding only the keys that changed (from the
        publishing thread alone); False once their runner is gone."""
        sums = self.sums()
        if sums is None:
            return False
        version = sums.version
        if version == self._written:
            return True
        for key, row in sums.take_changed():
            self._rows[key] = json.dumps([*key, *row])
        private.replace_file(self.path, f'{{"pid":{os.getpid()},"sums":[{",".join(self._rows.values())}]}}'.encode())
        self._written = version
        return True


def read(path: Path) -> dict[tuple[int, int], tuple[int, float, int, int]] | None:
    """The sums a :class:`Publisher` wrote to ``path``: (count, seconds, requests, tokens) by :func:`shape_key`; None
    where there is no file. PermissionError where it is not private to us, ValueError where it is not what a
    publisher writes or is larger than :data:`MAX_BYTES`."""
    try:
        fd = private.open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path}: over {MAX_BYTES} bytes; not read")
    try:
        sums = {(int(r), int(q)): (int(c), float(s), int(rs), int(ts))
                for r, q, c, s, rs, ts in json.loads(data)["sums"]}
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: not forward times ({type(exc).__name__}: {exc})") from None
    if not all(c >= 0 and 0.0 <= s < float("inf") for c, s, _, _ in sums.values()):
        raise ValueError(f"{path}: not forward times (a negative count or seconds not finite)")
    return sums


def named() -> Path | None:
    """The directory engines of this process's server publish to: ``SPECSCOPE_FORWARD_DIR``, else ``forward/`` in
    the server's share directory; None where neither is named."""
    from specscope.engine import share

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
        self._last: dict[int, dict[tuple[int, int], tuple[int, float, int, int]]] = {}
        self._versions: dict[int, tuple[int, int, int, int]] = {}  # each engine's file as last read

    def since(self, engine: int) -> list[tuple[int, int, int, float]]:
        """``(requests, tokens, count, seconds)`` rows of the forwards ``engine`` added since the last call: each
        key's as rows of whole tokens either side of their mean (:func:`_rows`), so that counts, seconds and tokens
        add up exactly; [] where nothing new was published. A file that cannot be read raises (once per version of
        it; the stat logger counts it in health) and its forwards come with the next one that can."""
        path = self.directory / f"{engine}.forward.json"
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return []
        version = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if self._versions.get(engine) == version:
            return []
        self._versions[engine] = version
        now = read(path)
        if now is None:
            return []
        last = self._last.get(engine, {})
        if any(now.get(key, (0,))[0] < row[0] for key, row in last.items()):
            last = {}  # the engine's process restarted: its sums began again
        self._last[engine] = now
        out = []
        for key, (c, s, rs, ts) in now.items():
            c0, s0, rs0, ts0 = last.get(key, (0, 0.0, 0, 0))
            if c > c0:
                out += _rows(c - c0, s - s0, rs - rs0, ts - ts0)
        return out


def _rows(count: int, seconds: float, requests: int, tokens: int) -> list[tuple[int, int, int, float]]:
    """``count`` forwards of one key, with these sums, as ``(requests, tokens, count, seconds)`` rows: requests
    their mean (exact below :data:`EXACT_REQUESTS`), tokens the whole numbers either side of their mean, as many
    forwards at each as make the tokens add up, and the seconds shared by count."""
    r = max(1, round(requests / count))
    t, above = divmod(tokens, count)
    first = seconds * (count - above) / count
    return [(r, t, count - above, first)] + ([(r, t + 1, above, seconds - first)] if above else [])
