"""``specscope top``: a terminal dashboard over specscope endpoints, vLLM and SGLang servers, or a recording."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from specscope.core import codec
from specscope.core.auth import is_loopback
from specscope.core.model import Snapshot
from specscope.export.alerts.rules import Thresholds
from specscope.read.fleet import Target, run_once
from specscope.read.scrape import (
    NO_PLUGIN,
    NO_PLUGIN_SAYS,
    EndpointSource,
    Source,
    SourceError,
    base_url,
    sglang_source,
    vllm_source,
)


class UsageError(ValueError):
    """Bad arguments: one line, exit code 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``top`` command's options."""
    p.add_argument("--url", action="append", default=[], metavar="URL",
                   help="a specscope endpoint (http://127.0.0.1:9464, or a server's /specscope)")
    p.add_argument("--vllm", action="append", default=[], metavar="URL", help="an unmodified vLLM server")
    p.add_argument("--sglang", action="append", default=[], metavar="URL", help="an SGLang server (--enable-metrics)")
    p.add_argument("--prometheus", metavar="URL", help="a fleet from Prometheus-compatible storage: every replica "
                   "whose vllm:* series it holds, one query per refresh")
    p.add_argument("--selector", default="", metavar="LABELS",
                   help='with --prometheus: label matchers, e.g. job="vllm",env=~"prod.*"')
    p.add_argument("--replay", metavar="FILE", help="play a recording made with --record")
    p.add_argument("--record", metavar="FILE", help="record every snapshot to FILE (JSON lines; gzip-compressed "
                   "where FILE ends in .gz)")
    p.add_argument("--record-max-mb", type=float, default=100.0, help="stop recording at this size (default 100)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    p.add_argument("--window", type=float, default=60.0, help="window length in seconds (default 60)")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for a target (default 2)")
    add_key_arguments(p, "--url targets")
    p.add_argument("--thresholds", help="JSON or YAML file of alert threshold overrides")
    p.add_argument("--baseline", metavar="FILE", help="the target's step times without speculation (specscope "
                   "calibrate): measures c and the K table for engines started without one")
    p.add_argument("--once", action="store_true", help="print one snapshot as text and exit")
    p.add_argument("--json", action="store_true", help="with --once: print it as JSON")


def add_key_arguments(p: argparse.ArgumentParser, where: str) -> None:
    """``--api-key`` and ``--api-key-host`` for the URLs ``where`` names (``top``'s --url, ``report``'s source)."""
    p.add_argument("--api-key", default=os.environ.get("SPECSCOPE_API_KEY") or os.environ.get("VLLM_API_KEY"),
                   metavar="KEY", help=f"bearer token for {where}: the server's --api-key (its /specscope) or the "
                   "endpoint's SPECSCOPE_API_KEY. Sent only to loopback hosts (127.0.0.1, ::1, localhost) and to the "
                   f"hosts named with --api-key-host, never elsewhere (default: $SPECSCOPE_API_KEY, else "
                   "$VLLM_API_KEY)")
    p.add_argument("--api-key-host", action="append", default=[], metavar="HOST[:PORT]",
                   help=f"also send --api-key to {where} on this host (repeatable, or comma-separated). Over plain "
                   "http:// the key crosses the network readable: specscope warns; prefer https:// or an SSH tunnel")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header a server started with ``--api-key`` wants."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _split(url: str, flag: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a target URL; UsageError, in a sentence, for one that is not a URL."""
    try:
        parts = urlsplit(base_url(url))
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        reason = "its port is not a number from 0 to 65535" if "port" in str(exc).lower() else str(exc)
        raise UsageError(f"{flag} {url!r} is not a URL ({reason[:1].lower() + reason[1:]})") from None
    if not host:
        raise UsageError(f"{flag} {url!r} names no host")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


def _host_spec(spec: str) -> tuple[str, int | None]:
    """``--api-key-host`` HOST, HOST:PORT, [V6] or [V6]:PORT as ``(host, port or None)``."""
    host, port = spec.strip(), ""
    if host.startswith("["):
        host, _, port = host[1:].partition("]")
        port = port.removeprefix(":")
    elif host.count(":") == 1:
        host, _, port = host.partition(":")
    if not host or (port and not port.isdigit()):
        raise UsageError(f"--api-key-host takes HOST or HOST:PORT, got {spec!r}")
    return host.lower().rstrip("."), int(port) if port else None


def key_headers(urls: Sequence[str], api_key: str | None, key_hosts: Sequence[str],
                flag: str = "--url") -> list[dict[str, str]]:
    """Each URL's headers: the API key where it may go (a loopback host, or one named in ``key_hosts``), nothing
    elsewhere. Warns once on stderr when the key would cross the network over plain http; UsageError for a URL or
    host that is not one."""
    targets = [_split(u, flag) for u in urls]
    named = [_host_spec(h) for spec in key_hosts for h in spec.split(",") if h.strip()]
    if named and not api_key:
        raise UsageError("--api-key-host goes with --api-key (or $SPECSCOPE_API_KEY, $VLLM_API_KEY)")
    for host, port in named:
        if not any(host == h and port in (None, p) for _, h, p in targets):
            shown = f"[{host}]" if ":" in host else host
            raise UsageError(f"--api-key-host {shown}{'' if port is None else f':{port}'} matches no {flag} host")
    out, plain = [], []
    for scheme, host, port in targets:
        send = bool(api_key) and (is_loopback(host) or any(host == h and q in (None, port) for h, q in named))
        if send and scheme == "http" and not is_loopback(host) and host not in plain:
            plain.append(host)
        out.append(auth_headers(api_key) if send else {})
    if plain:
        print(f"specscope: warning: the API key goes to {', '.join(plain)} over plain http, readable by anyone on "
              "the way; prefer https:// or an SSH tunnel to 127.0.0.1", file=sys.stderr)
    return out


class _KeyWithheld(EndpointSource):
    """A --url the API key does not go to: a 401 says why it was not sent."""

    def fetch(self) -> Snapshot:
        try:
            return super().fetch()
        except SourceError as exc:
            if str(exc).endswith("HTTP 401"):
                raise SourceError(f"{exc} (the API key goes only to loopback hosts and to those named with "
                                  "--api-key-host)") from None
            raise


def sources(args: argparse.Namespace) -> list[Source]:
    """The targets the arguments name; UsageError when there are none or they conflict."""
    headers = key_headers(args.url, args.api_key, args.api_key_host)
    out: list[Source] = [EndpointSource(u, args.timeout, headers=h) if h or not args.api_key
                         else _KeyWithheld(u, args.timeout) for u, h in zip(args.url, headers, strict=True)]
    for flag in ("--vllm", "--sglang"):
        for u in getattr(args, flag[2:]):
            _split(u, flag)
    out += [vllm_source(u, args.timeout) for u in args.vllm]
    out += [sglang_source(u, args.timeout) for u in args.sglang]
    if args.selector and not args.prometheus:
        raise UsageError("--selector goes with --prometheus")
    if args.prometheus:
        from specscope.read.prometheus_source import PrometheusFleet

        try:
            fleet = PrometheusFleet(args.prometheus, args.selector, args.timeout, max_age=args.interval / 2,
                                    window_s=args.window)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        out += fleet.sources()
    if args.replay and out:
        raise UsageError("--replay plays a recording; it does not mix with --url, --vllm, --sglang or --prometheus")
    if not out and not args.replay:
        raise UsageError("name a target: --url, --vllm, --sglang, --prometheus or --replay FILE (or run `specscope "
                         "demo`)")
    if args.interval <= 0 or args.window <= 0 or args.timeout <= 0 or args.record_max_mb <= 0:
        raise UsageError("--interval, --window, --timeout and --record-max-mb must be positive")
    if args.json and not args.once:
        raise UsageError("--json goes with --once")
    return out


def main(args: argparse.Namespace) -> int:
    """Run ``specscope top``; returns the exit code."""
    from specscope.export.alerts.rules import RuleConfigError, load_thresholds
    from specscope.read.tui.record import Player, Recorder, ReplaySource
    from specscope.verdict import load_profile

    try:
        srcs = sources(args)
        thresholds = load_thresholds(args.thresholds) if args.thresholds else Thresholds()
        baseline = load_profile(args.baseline) if args.baseline else None
        player = None
        if args.replay:
            player = Player(args.replay)
            srcs = [ReplaySource(player, name) for name in player.targets]
    except (UsageError, RuleConfigError, ValueError) as exc:
        print(f"specscope: error: {exc}", file=sys.stderr)
        return 2
    targets = [Target(s, thresholds, baseline=baseline) for s in srcs]
    if args.once:
        return _once(targets, args, player)
    try:
        recorder = Recorder(args.record, int(args.record_max_mb * (1 << 20))) if args.record else None
    except OSError as exc:
        print(f"specscope: error: cannot write {args.record}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    from specscope.read.tui.app import TopApp

    app = TopApp(targets, interval=args.interval, window_s=args.window, player=player, recorder=recorder,
                 thresholds=thresholds)
    try:
        app.run()
    finally:
        if recorder is not None:
            recorder.close()
    return 0


def _once(targets: list[Target], args: argparse.Namespace, player: object | None) -> int:
    from specscope.export.summary import request_table, summary
    from specscope.read.tui.record import Player

    if isinstance(player, Player):
        while not player.finished:  # play it all, so windows and alerts evolve as they did
            player.step()
            for t in targets:
                t.poll()
                t.evaluate()
        if player.skipped:
            print(f"specscope: {player.path}: {player.skipped} unusable line{'s' if player.skipped > 1 else ''} "
                  "skipped (torn, not a snapshot, or no finite time)", file=sys.stderr)
    else:
        run_once(targets)
    failed = [t for t in targets if t.error or t.snapshot is None]
    for t in failed:
        print(f"specscope: {t.name}: {t.error or 'no snapshot'}", file=sys.stderr)
    good = [t for t in targets if t not in failed]
    refused = [t for t in good if args.baseline and t.snapshot and t.snapshot.baseline_problem]
    for t in refused:
        print(f"specscope: error: {t.name}: baseline refused: {t.snapshot.baseline_problem}",  # type: ignore[union-attr]
              file=sys.stderr)
    if refused:
        return 2
    if args.json:
        docs = {t.name: codec.to_dict(t.windowed(args.window)) for t in good}  # type: ignore[arg-type]
        print(json.dumps(next(iter(docs.values())) if len(targets) == 1 and docs else docs, indent=1))
    else:
        for t in good:
            snap = t.windowed(args.window)
            assert snap is not None
            alerts = t.evaluate()
            print(f"== {t.name}")
            print(summary(snap))
            if "requests" not in snap.unavailable and snap.requests:
                print(request_table(snap.requests[-10:]))
            for a in alerts:
                print(f"alert {a.state} {a.rule}: {a.summary}")
            for where, n in t.rule_errors.items():
                print(f"specscope error: {where} failed {n} time(s) (last: {t.last_rule_error})")
            for what in snap.unavailable:
                print(NO_PLUGIN_SAYS if what == NO_PLUGIN else f"n/a from this source: {what}")
    return 1 if failed else 0
