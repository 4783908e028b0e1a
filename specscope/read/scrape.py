"""Remote sources: a specscope endpoint's ``/snapshot``, an unmodified vLLM's or SGLang's ``/metrics``.

Each source turns what it fetches into the same :class:`~specscope.core.model.Snapshot`. A ``/metrics`` page has only
engine-wide numbers: what it cannot give is listed in ``Snapshot.unavailable`` (per-request rows, GPU memory,
the KV token estimate), never filled with zeros. Lifetime counters are exact; windows are computed by the
consumer from successive snapshots. A fetch that fails raises :class:`SourceError` with one line.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, runtime_checkable

from specscope.core import codec
from specscope.core.auth import base_url, read_url
from specscope.core.model import (
    RequestRecord,
    Snapshot,
)
from specscope.engine.middleware import SNAPSHOT_PATH
from specscope.read.metrics_snapshot import sglang_snapshot, vllm_snapshot
from specscope.read.promtext import ParseError, Samples, parse

#: In ``Snapshot.unavailable`` where the server answers /metrics but has no specscope (the plugin never loaded: not
#: installed, or vLLM 0.33's Rust front end, which loads no Python plugin), so it cannot be read as an endpoint.
NO_PLUGIN = "specscope_plugin"
#: What :data:`NO_PLUGIN` means, in a line for the screen.
NO_PLUGIN_SAYS = ("specscope is not loaded in this server (/specscope/snapshot: 404): not installed, or vLLM's "
                  "Rust front end")
#: Seconds between probes of :data:`PLUGIN_PATH` (a server restarted with or without the plugin is seen again).
PROBE_EVERY_S = 60.0


class SourceError(Exception):
    """A target could not be read; the message is one line for the screen."""


class NotAnEndpoint(SourceError):
    """The URL's server answers, but it is not a specscope endpoint: the line says what it is, and the URL or flag
    that reads it (bad input, where a command is told the URL)."""


class Source(Protocol):
    """Something a dashboard can poll for snapshots."""

    name: str

    def fetch(self) -> Snapshot:
        """The target's current snapshot; SourceError when it cannot be had."""
        ...


@runtime_checkable
class WindowedSource(Source, Protocol):
    """A source whose storage windows the counters itself (PromQL ``increase()`` over ``window_s``)."""

    window_s: float


def http_get(url: str, timeout: float, headers: dict[str, str] | None = None, data: bytes | None = None) -> str:
    """The body at ``url`` (POSTed ``data``, form-encoded, when given); SourceError with one line otherwise.
    ``headers`` (the API key) follow a redirect only to the same scheme, host and port
    (:func:`specscope.core.auth.read_url`)."""
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        return read_url(request, timeout).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise SourceError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"{url}: {reason}") from None


class EndpointSource:
    """A specscope endpoint (``specscope.LLM`` exports, the plugin, or the middleware).

    After the first fetch it asks only for the request records that became final since the last one it has
    (``?since=``) and keeps the last ``max_requests`` itself, so a poll costs the server little whatever its
    history. A restarted engine (its counters or records begin again) is read afresh. ``headers`` are sent
    with every request (``Authorization: Bearer ...`` for a server started with ``--api-key``).
    """

    def __init__(self, url: str, timeout: float = 2.0, name: str | None = None, max_requests: int = 1000,
                 headers: dict[str, str] | None = None) -> None:
        base = base_url(url)
        self.url = base if base.endswith("/snapshot") else base + "/snapshot"
        self.root = base.removesuffix("/snapshot").removesuffix("/specscope")
        self.name = name or self.root
        self.timeout = timeout
        self.headers = headers or {}
        #: What the server is instead of a specscope endpoint (the :class:`NotAnEndpoint` line), as the last fetch
        #: found it; None while the URL reads as one, or its 404 says nothing more.
        self.not_an_endpoint: str | None = None
        self._asked_at = -PROBE_EVERY_S
        self._requests: deque[RequestRecord] = deque(maxlen=max_requests)
        self._cursor: int | None = None
        self._started: float | None = None

    def fetch(self) -> Snapshot:
        """GET /snapshot (only what is new, after the first) and rebuild the full snapshot."""
        incremental, snap = self._fetch(self._cursor)
        if incremental and snap.started_at != self._started:  # the engine restarted: read it afresh
            incremental, snap = self._fetch(None)
        if not incremental:
            self._requests.clear()
            self._started = snap.started_at
            if not any(r.final_seq for r in snap.requests):  # a server that does not number its records
                self._cursor = None
                return snap
        self._requests.extend(sorted((r for r in snap.requests if r.final_seq > (self._cursor or 0)),
                                     key=lambda r: r.final_seq))
        self._cursor = max((r.final_seq for r in self._requests), default=0)
        return replace(snap, requests=tuple(self._requests))

    def _fetch(self, since: int | None) -> tuple[bool, Snapshot]:
        url = self.url if since is None else f"{self.url}?since={since}"
        try:
            text = http_get(url, self.timeout, self.headers)
        except SourceError as exc:
            if str(exc).endswith("HTTP 404") and self._what_answers():
                raise NotAnEndpoint(self.not_an_endpoint) from None
            raise
        self.not_an_endpoint, self._asked_at = None, -PROBE_EVERY_S
        try:
            doc = json.loads(text)
            return isinstance(doc, dict) and "requests_since" in doc, codec.from_dict(doc)
        except ValueError as exc:
            raise SourceError(f"{self.url}: not a specscope snapshot ({str(exc)[:80]})") from None

    def _what_answers(self) -> str | None:
        """:attr:`not_an_endpoint` where the URL answered 404: asked of the server once (then every
        :data:`PROBE_EVERY_S` seconds while the 404s go on), never while the URL reads as an endpoint."""
        if time.monotonic() - self._asked_at >= PROBE_EVERY_S:
            self._asked_at = time.monotonic()
            self.not_an_endpoint = vllm_instead(self.root, self.url, self.timeout, self.headers)
        return self.not_an_endpoint


#: A ``?since=`` above every record's ``final_seq``: the snapshot's head alone, for a probe.
_NO_RECORDS = 2**63 - 1


def vllm_instead(root: str, asked: str, timeout: float, headers: dict[str, str] | None = None) -> str | None:
    """Where ``asked`` (a ``/snapshot`` URL on ``root``) answered 404: one line saying that ``root`` is a vLLM server,
    and what reads it: specscope's snapshot at ``root/specscope`` (the middleware's :data:`SNAPSHOT_PATH`), or
    ``--vllm`` for vLLM's own /metrics where that path is 404 too. One GET of vLLM's ``/version`` and, for a vLLM
    server, one of that path (its head only), both with ``headers``; None for any other server, or no answer."""
    try:
        doc = json.loads(http_get(root + "/version", timeout, headers))
    except Exception:  # no answer, not JSON, a URL urllib cannot take: not known to be vLLM
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("version"), str)):
        return None
    served = root + SNAPSHOT_PATH
    absent = asked == served
    if not absent:
        try:
            http_get(f"{served}?since={_NO_RECORDS}", timeout, headers)
        except SourceError as exc:
            absent = str(exc).endswith("HTTP 404")  # any other answer, 401 included, means it is served
        except Exception:
            pass
    own = f"--vllm {root} reads vLLM's own /metrics"
    if absent:
        return f"{root} is a vLLM server without specscope ({SNAPSHOT_PATH}: 404): {own}"
    endpoint = root + SNAPSHOT_PATH.removesuffix("/snapshot")
    return f"{root} is a vLLM server: specscope's snapshot is at {endpoint} ({own})"


class MetricsSource:
    """An engine's Prometheus ``/metrics`` page, mapped into a snapshot by ``convert``. With ``probe`` (a path on the
    same server), the path is asked for every :data:`PROBE_EVERY_S` seconds, and a 404 there puts
    :data:`NO_PLUGIN` in the snapshot's ``unavailable`` (any other answer, 401 included, means it is served)."""

    def __init__(self, url: str, convert: Callable[[Samples, float], Snapshot], timeout: float = 2.0,
                 probe: str | None = None) -> None:
        base = base_url(url)
        self.url = base if base.endswith("/metrics") else base + "/metrics"
        self.name = base.removesuffix("/metrics")
        self.convert = convert
        self.timeout = timeout
        self.probe = probe
        self._absent: bool | None = None
        self._probed_at = -PROBE_EVERY_S

    def fetch(self) -> Snapshot:
        """GET /metrics and convert it."""
        text = http_get(self.url, self.timeout)
        try:
            snap = self.convert(parse(text), time.time())
        except (ParseError, ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"{self.url}: not a metrics page ({str(exc)[:80]})") from None
        return replace(snap, unavailable=(*snap.unavailable, NO_PLUGIN)) if self._probe_absent() else snap

    def _probe_absent(self) -> bool:
        """Whether the probed path answered 404 (the last answer; unknown while it cannot be reached)."""
        if self.probe is None or time.monotonic() - self._probed_at < PROBE_EVERY_S:
            return bool(self._absent)
        self._probed_at = time.monotonic()
        try:
            http_get(self.name + self.probe, self.timeout)
            self._absent = False
        except SourceError as exc:
            said = str(exc)
            if " HTTP " in said:  # the server answered (no answer keeps what the last probe found)
                self._absent = said.endswith("HTTP 404")
        except Exception:  # a URL urllib cannot take: the probe says nothing
            self._absent = None
        return bool(self._absent)


class HubSource:
    """A hub in this process (``specscope demo``)."""

    def __init__(self, hub: object, name: str) -> None:
        self.hub = hub
        self.name = name

    def fetch(self) -> Snapshot:
        """The hub's snapshot."""
        return self.hub.snapshot()  # type: ignore[attr-defined]


def vllm_source(url: str, timeout: float = 2.0) -> MetricsSource:
    """An unmodified vLLM server."""
    return MetricsSource(url, vllm_snapshot, timeout, probe=SNAPSHOT_PATH)


def sglang_source(url: str, timeout: float = 2.0) -> MetricsSource:
    """An SGLang server started with ``--enable-metrics``."""
    return MetricsSource(url, sglang_snapshot, timeout)
