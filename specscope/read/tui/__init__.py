"""``specscope top``: a terminal dashboard over specscope endpoints, vLLM and SGLang servers, or a recording."""

from __future__ import annotations

import argparse
import json
import sys

from specscope.core import codec
from specscope.core.auth import KEY_WITHHELD, add_key_arguments, key_headers, url_origin
from specscope.core.bad_input import EXIT_BAD_INPUT, UsageError, fail
from specscope.core.model import Snapshot
from specscope.export.alerts.rules import Thresholds
from specscope.read.fleet import Target, run_once
from specscope.read.scrape import (
    NO_PLUGIN,
    NO_PLUGIN_SAYS,
    EndpointSource,
    Source,
    SourceError,
    sglang_source,
    vllm_source,
)


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


class _KeyWithheld(EndpointSource):
    """A --url the API key does not go to: a 401 says why it was not sent."""

    def fetch(self) -> Snapshot:
        try:
            return super().fetch()
        except SourceError as exc:
            if str(exc).endswith("HTTP 401"):
                raise SourceError(f"{exc} ({KEY_WITHHELD})") from None
            raise


def sources(args: argparse.Namespace) -> list[Source]:
    """The targets the arguments name; UsageError when there are none or they conflict."""
    headers = key_headers(args.url, args.api_key, args.api_key_host)
    out: list[Source] = [EndpointSource(u, args.timeout, headers=h) if h or not args.api_key
                         else _KeyWithheld(u, args.timeout) for u, h in zip(args.url, headers, strict=True)]
    for flag in ("--vllm", "--sglang"):
        for u in getattr(args, flag[2:]):
            url_origin(u, flag)
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
        return fail(exc)
    targets = [Target(s, thresholds, baseline=baseline) for s in srcs]
    if args.once:
        return _once(targets, args, player)
    try:
        recorder = Recorder(args.record, int(args.record_max_mb * (1 << 20))) if args.record else None
    except OSError as exc:
        return fail(f"cannot write {args.record}: {exc.strerror or exc}")
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
    # A --url that names another kind of server (vLLM's root, not its /specscope) is bad input, said as such.
    misnamed = [t for t in failed if isinstance(t.source, EndpointSource) and t.source.not_an_endpoint]
    for t in failed:
        if t in misnamed:
            fail(t.error)
        else:
            print(f"specscope: {t.name}: {t.error or 'no snapshot'}", file=sys.stderr)
    good = [t for t in targets if t not in failed]
    refused = [t for t in good if args.baseline and t.snapshot and t.snapshot.baseline_problem]
    for t in refused:
        fail(f"{t.name}: baseline refused: {t.snapshot.baseline_problem}")  # type: ignore[union-attr]
    if refused or misnamed:
        return EXIT_BAD_INPUT
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
