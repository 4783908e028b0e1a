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
    EngineInfo,
    EngineView,
    GpuMemory,
    Histogram,
    KVCache,
    RequestRecord,
    Snapshot,
    SpecCounts,
    TokenizerStatus,
    Totals,
)
from specscope.engine.middleware import SNAPSHOT_PATH
from specscope.export.catalogue import exported_name as _p
from specscope.read.promtext import ParseError, Samples, parse
from specscope.state.merge import combine_kv

#: What a /metrics page cannot provide.
METRICS_PAGE_UNAVAILABLE = ("requests", "gpu", "kv_tokens", "tokenizer", "cost_ratio", "window")
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


def _sum(samples: Samples, name: str) -> float | None:
    rows = samples.get(name)
    return None if rows is None else sum(v for _, v in rows)


def _int(samples: Samples, name: str) -> int:
    """A counter as an int; 0 when the page lacks it, which the snapshot then lists as unavailable."""
    return round(_sum(samples, name) or 0)


def _label(samples: Samples, name: str, label: str) -> str | None:
    rows = samples.get(name) or []
    return next((labels[label] for labels, _ in rows if label in labels), None)


def _label_int(samples: Samples, name: str, label: str) -> int | None:
    value = _label(samples, name, label)
    return int(value) if value and value.isdigit() else None


def _histogram(samples: Samples, name: str) -> Histogram | None:
    """A Prometheus histogram summed over label sets, as bucket counts (not cumulative)."""
    rows = samples.get(name + "_bucket")
    if not rows:
        return None
    cumulative: dict[float, float] = {}
    for labels, v in rows:
        le = float(labels.get("le", "+Inf"))
        cumulative[le] = cumulative.get(le, 0.0) + v
    bounds = sorted(b for b in cumulative if b != float("inf"))
    counts, prev = [], 0.0
    for b in [*bounds, float("inf")]:
        c = cumulative.get(b, prev)
        counts.append(int(c - prev))
        prev = c
    return Histogram(tuple(bounds), tuple(counts), _sum(samples, name + "_sum") or 0.0)


def _engine_samples(samples: Samples, engine: str) -> Samples:
    """The rows of one data-parallel engine (vLLM's ``engine`` label)."""
    return {name: [(lb, v) for lb, v in rows if lb.get("engine") == engine] for name, rows in samples.items()}


def _vllm_spec(samples: Samples) -> SpecCounts | None:
    per_pos: dict[int, float] = {}
    for labels, v in samples.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", []):
        pos = int(labels.get("position", "0"))
        per_pos[pos] = per_pos.get(pos, 0.0) + v
    drafts = _sum(samples, "vllm:spec_decode_num_drafts_total")
    draft_tokens = _sum(samples, "vllm:spec_decode_num_draft_tokens_total")
    accepted = _sum(samples, "vllm:spec_decode_num_accepted_tokens_total")
    if drafts is None or draft_tokens is None or accepted is None or not per_pos:
        return None  # acceptance is accepted / drafted: without both there is none, never 0
    k = max(per_pos) + 1
    return SpecCounts(
        num_spec_tokens=k,
        drafts=round(drafts),
        draft_tokens=round(draft_tokens),
        accepted=round(accepted),
        accepted_per_pos=tuple(round(per_pos.get(i, 0)) for i in range(k)),
    )


#: The snapshot's numbers (names in ``Snapshot.unavailable``) that a page without these counters cannot give.
_VLLM_COUNTED = (("vllm:prompt_tokens_total", "prompt_tokens"), ("vllm:generation_tokens_total", "generation_tokens"),
                 ("vllm:request_success_total", "request_count"), ("vllm:num_preemptions_total", "preemptions"),
                 ("vllm:prefix_cache_queries_total", "prefix_cache"), ("vllm:prefix_cache_hits_total", "prefix_cache"))


def _vllm_missing(samples: Samples) -> tuple[str, ...]:
    """What the page's missing counters leave unknown (their totals read 0 and are listed as unavailable)."""
    missing = {what for name, what in _VLLM_COUNTED if name not in samples}
    if "vllm:spec_decode_num_drafts_total" in samples and _vllm_spec(samples) is None:
        missing.add("spec_counts")  # speculating, but a count acceptance needs is gone
    return tuple(sorted(missing))


def _vllm_totals(samples: Samples, seconds: float) -> Totals:
    return Totals(
        seconds=seconds,
        steps=_int(samples, "vllm:iteration_tokens_total_count"),
        prompt_tokens=_int(samples, "vllm:prompt_tokens_total"),
        generation_tokens=_int(samples, "vllm:generation_tokens_total"),
        requests=_int(samples, "vllm:request_success_total"),
        preemptions=_int(samples, "vllm:num_preemptions_total"),
        prefix_cache_queries=_int(samples, "vllm:prefix_cache_queries_total"),
        prefix_cache_hits=_int(samples, "vllm:prefix_cache_hits_total"),
        spec=_vllm_spec(samples),
    )


def _optional_int(v: float | None) -> int | None:
    return None if v is None else int(v)


#: The ``vllm:*`` series :func:`vllm_snapshot` reads, and its histograms (``_bucket`` and ``_sum``), for sources
#: that can ask for only these.
VLLM_SERIES = ("cache_config_info", "generation_tokens_total", "iteration_tokens_total_count",
               "kv_cache_usage_perc", "num_preemptions_total", "num_requests_running", "num_requests_waiting",
               "prefix_cache_hits_total", "prefix_cache_queries_total", "prompt_tokens_total", "request_success_total",
               "spec_decode_num_accepted_tokens_per_pos_total", "spec_decode_num_accepted_tokens_total",
               "spec_decode_num_draft_tokens_total", "spec_decode_num_drafts_total")
#: The counters among them, whose increase over a window makes the snapshot's window.
VLLM_COUNTERS = tuple(n for n in VLLM_SERIES if n.endswith(("_total", "_count")))
VLLM_HISTOGRAMS = ("e2e_request_latency_seconds", "time_to_first_token_seconds",
                   "request_time_per_output_token_seconds")


def vllm_snapshot(samples: Samples, now: float) -> Snapshot:
    """vLLM's ``/metrics`` (names ``vllm:*``) as a snapshot: each data-parallel engine (its ``engine`` label) in
    ``engines``, and their sums (KV-cache usage: the engines' mean, each having the same number of blocks)."""
    if not any(name.startswith("vllm:") for name in samples):
        raise ValueError("no vllm:* metrics on the page")
    started = _sum(samples, "process_start_time_seconds")
    started = min(started, now) if started else now
    block_size = _label_int(samples, "vllm:cache_config_info", "block_size")
    num_blocks = _label_int(samples, "vllm:cache_config_info", "num_gpu_blocks")
    indexes = sorted({lb["engine"] for name, rows in samples.items() if name.startswith("vllm:")
                      for lb, _ in rows if lb.get("engine", "").isdigit()}, key=int)
    engines = []
    for index in indexes:
        one = _engine_samples(samples, index)
        engines.append(EngineView(
            index=int(index), lifetime=_vllm_totals(one, now - started), window=Totals(seconds=0.0),
            running=_optional_int(_sum(one, "vllm:num_requests_running")),
            waiting=_optional_int(_sum(one, "vllm:num_requests_waiting")),
            kv=KVCache(block_size=block_size, num_blocks=num_blocks,
                       block_usage=_sum(one, "vllm:kv_cache_usage_perc"))))
    lifetime = _vllm_totals(samples, now - started)
    k = lifetime.spec.num_spec_tokens if lifetime.spec else None
    info = EngineInfo(server="vllm", model=_label(samples, "vllm:num_requests_running", "model_name"),
                      method="speculative" if lifetime.spec else None, num_speculative_tokens=k,
                      block_size=block_size, num_blocks=num_blocks)
    return Snapshot(
        time=now,
        started_at=started,
        engine=info,
        lifetime=lifetime,
        window=Totals(seconds=0.0),
        window_seconds=0.0,
        running=_optional_int(_sum(samples, "vllm:num_requests_running")),
        waiting=_optional_int(_sum(samples, "vllm:num_requests_waiting")),
        kv=combine_kv(info, engines) if engines else KVCache(
            block_size=block_size, num_blocks=num_blocks, block_usage=_sum(samples, "vllm:kv_cache_usage_perc")),
        gpu=GpuMemory(status="not reported by vLLM's /metrics"),
        requests=(),
        request_acceptance_rate=None,
        request_acceptance_length=None,
        request_duration=_histogram(samples, "vllm:e2e_request_latency_seconds"),
        time_to_first_token=_histogram(samples, "vllm:time_to_first_token_seconds"),
        time_per_output_token=_histogram(samples, "vllm:request_time_per_output_token_seconds"),
        unavailable=(*METRICS_PAGE_UNAVAILABLE, *_vllm_missing(samples)),
        engines=tuple(engines),
    )


def with_window(snap: Snapshot, increases: Samples, seconds: float) -> Snapshot:
    """``snap`` with its window (the server's and each engine's) from the counters' increases over the last
    ``seconds`` (PromQL ``increase()``, keyed by the counters' ``vllm:*`` names)."""
    if not increases:
        return snap
    engines = tuple(replace(e, window=_vllm_totals(_engine_samples(increases, str(e.index)), seconds))
                    for e in snap.engines)
    return replace(snap, window=_vllm_totals(increases, seconds), window_seconds=seconds, engines=engines,
                   unavailable=tuple(u for u in snap.unavailable if u != "window"))


#: specscope's exported series that say what vLLM's own say: their vLLM names (by ``state`` for split series).
SPECSCOPE_AS_VLLM: dict[str, str | dict[str, str]] = {
    _p("specscope.spec_decode.drafts"): "vllm:spec_decode_num_drafts_total",
    _p("specscope.spec_decode.draft_tokens"): "vllm:spec_decode_num_draft_tokens_total",
    _p("specscope.spec_decode.accepted_tokens"): "vllm:spec_decode_num_accepted_tokens_total",
    _p("specscope.spec_decode.accepted_tokens_per_position"): "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    _p("specscope.tokens"): {"input": "vllm:prompt_tokens_total", "output": "vllm:generation_tokens_total"},
    _p("specscope.requests"): "vllm:request_success_total",
    _p("specscope.engine.preemptions"): "vllm:num_preemptions_total",
    _p("specscope.engine.requests"): {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"},
    _p("specscope.kv_cache.block_usage"): "vllm:kv_cache_usage_perc",
}
#: What only specscope's series say: the start-up tokenizer check.
SPECSCOPE_ONLY = (_p("specscope.tokenizer.verdict"), _p("specscope.tokenizer.overlap"))
SPECSCOPE_SERIES = (*SPECSCOPE_AS_VLLM, *SPECSCOPE_ONLY)
SPECSCOPE_COUNTERS = tuple(n for n in SPECSCOPE_AS_VLLM if n.endswith("_total"))


def as_vllm(samples: Samples) -> Samples:
    """specscope's series under vLLM's names and labels (``model`` as ``model_name``); others dropped."""
    out: Samples = {}
    for name, rows in samples.items():
        target = SPECSCOPE_AS_VLLM.get(name)
        for labels, value in rows:
            vllm_name = target.get(labels.get("state", "")) if isinstance(target, dict) else target
            if vllm_name is None:
                continue
            lb = {k: v for k, v in labels.items() if k not in ("state", "model")}
            lb["model_name"] = labels.get("model", "")
            out.setdefault(vllm_name, []).append((lb, value))
    return out


def specscope_snapshot(samples: Samples, now: float) -> Snapshot:
    """specscope's exported series (a specscope endpoint, as Prometheus stores it) as a snapshot: the counters and
    gauges vLLM's own series carry, read as :func:`vllm_snapshot` reads those, per engine, plus the draft and
    method it names and the start-up tokenizer check, which only specscope knows."""
    snap = vllm_snapshot(as_vllm(samples), now)
    verdict_name, overlap_name = SPECSCOPE_ONLY
    labels = next((lb for rows in samples.values() for lb, _ in rows if "draft_model" in lb), {})
    verdict = next((lb.get("state") for lb, v in samples.get(verdict_name, []) if v == 1.0), None)
    info = replace(snap.engine, server=labels.get("server") or snap.engine.server,
                   draft_model=labels.get("draft_model") or None, method=labels.get("method") or snap.engine.method)
    return replace(snap, engine=info,
                   tokenizer=TokenizerStatus(verdict, overlap=_sum(samples, overlap_name)) if verdict else None,
                   unavailable=tuple(u for u in snap.unavailable if u != "tokenizer" or verdict is None))


def sglang_snapshot(samples: Samples, now: float) -> Snapshot:
    """SGLang's ``/metrics`` (``--enable-metrics``, names ``sglang:*``) as a snapshot.

    SGLang reports acceptance only as gauges (recent averages), so they go to ``Snapshot.reported`` and the
    speculative counts stay unavailable.
    """
    if not any(name.startswith("sglang:") for name in samples):
        raise ValueError("no sglang:* metrics on the page")
    reported = []
    for key, name in (("acceptance_rate", "sglang:spec_accept_rate"),
                      ("mean_acceptance_length", "sglang:spec_accept_length"),
                      ("verify_steps", "sglang:spec_verify_calls_total")):
        v = _sum(samples, name)
        if v is not None:
            reported.append((key, v))
    running = _sum(samples, "sglang:num_running_reqs")
    waiting = _sum(samples, "sglang:num_queue_reqs")
    return Snapshot(
        time=now,
        started_at=now,
        engine=EngineInfo(server="sglang", model=_label(samples, "sglang:num_running_reqs", "model_name"),
                          method="speculative" if reported else None),
        lifetime=Totals(seconds=0.0,
                        prompt_tokens=_int(samples, "sglang:prompt_tokens_total"),
                        generation_tokens=_int(samples, "sglang:generation_tokens_total")),
        window=Totals(seconds=0.0),
        window_seconds=0.0,
        running=None if running is None else int(running),
        waiting=None if waiting is None else int(waiting),
        kv=KVCache(block_usage=_sum(samples, "sglang:token_usage")),
        gpu=GpuMemory(status="not reported by SGLang's /metrics"),
        requests=(),
        request_acceptance_rate=None,
        request_acceptance_length=None,
        time_to_first_token=_histogram(samples, "sglang:time_to_first_token_seconds"),
        request_duration=_histogram(samples, "sglang:e2e_request_latency_seconds"),
        unavailable=(*METRICS_PAGE_UNAVAILABLE, "spec_counts"),
        reported=tuple(reported),
    )


def vllm_source(url: str, timeout: float = 2.0) -> MetricsSource:
    """An unmodified vLLM server."""
    return MetricsSource(url, vllm_snapshot, timeout, probe=SNAPSHOT_PATH)


def sglang_source(url: str, timeout: float = 2.0) -> MetricsSource:
    """An SGLang server started with ``--enable-metrics``."""
    return MetricsSource(url, sglang_snapshot, timeout)
